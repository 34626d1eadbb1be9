"""Replacing one local node: a new namespace, sshd (new host key) and disk under the old name.

The node keeps its name, index, role, slots and address (they follow from the cluster's slot and
the node's index), so hostfiles keep their order and the other nodes' static neighbour entries
stay right.  All or nothing, in three steps:

1. the new node's directory and host key are made aside (``nodes/.new-<name>``); a failure here
   removes them and the old node is untouched;
2. the old node's processes, namespace and veth are removed (they share the new one's names),
   its directory is moved to ``nodes/.old-<name>`` and the new one into place;
3. the network is made and the node started; once its sshd answers the old directory (its disk)
   is deleted.  A failure in 2 or 3 removes everything of the new node and puts the old
   directory back: the node is then down (as it was when it died) and `replace` can run again.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from clustertool.core import state
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node, Reporter, silent
from clustertool.providers.local import firewall, net, nodes, sysops

WAIT_S = 30.0  # a node's sshd answers in well under a second


def replace_node(cluster: ClusterRecord, name: str, keep_old: bool = False, report: Reporter = silent,
                 save: Callable[[], object] = lambda: None) -> Node:
    """A new node for ``name`` (its new host key in ``host_keys``); the old one is gone."""
    if keep_old:
        raise UsageError("the local provider cannot keep the old node: the new one takes its namespace and address")
    old = cluster.node(name)
    ps = cluster.provider_state
    slot, nodes_dir = int(ps["slot"]), Path(ps["nodes_dir"])
    node_dir, staging, attic = nodes_dir / name, nodes_dir / f".new-{name}", nodes_dir / f".old-{name}"
    for leftover in (staging, attic):  # of an earlier try that was killed outright
        shutil.rmtree(leftover, ignore_errors=True)
    report(f"{name}: making a new disk and host key")
    try:
        public_key = state.ClusterPaths(cluster.name).pubkey.read_text().strip()
        keygen = nodes.write_node_dir(cluster.name, slot, old.index, name, staging, public_key, final_dir=node_dir)
        host_keys = _host_keys(keygen, staging, name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report(f"{name}: removing the old node (its processes, namespace {net.netns_name(cluster.name, old.index)})")
    try:
        remove_node(cluster, old)
        ps.setdefault("pids", {}).pop(name, None)
        save()
        if node_dir.exists():
            node_dir.rename(attic)
        staging.rename(node_dir)
        report(f"{name}: starting the new node at {old.address}")
        nodes.make_network(cluster, slot, [old.index], peers=sorted(n.index for n in cluster.nodes))
        ps["pids"][name] = nodes.start_node(cluster, old.index)
        save()
        new = dataclasses.replace(old, host_keys=host_keys, state="running", cordon=None)
        _wait(cluster, new, ps["pids"][name])
    except BaseException:
        _undo(cluster, old, node_dir, staging, attic)
        save()
        raise
    shutil.rmtree(attic, ignore_errors=True)
    return new


def remove_node(cluster: ClusterRecord, node: Node) -> list[int]:
    """Kill every process of the node (its namespace's and its launcher) and delete its namespace
    and veth; idempotent.  Returns the pids killed."""
    ns = net.netns_name(cluster.name, node.index)
    killed: list[int] = []
    launcher = cluster.provider_state.get("pids", {}).get(node.name)
    for _ in range(5):  # again until none is left: a process may have been mid-fork
        pids = set(sysops.pids_in_netns([ns]).get(ns, []))
        if launcher and sysops.alive(launcher):
            pids.add(launcher)
        pids.difference_update(killed)
        if not pids:
            break
        killed += sysops.kill_all(sorted(pids), reap=nodes.reap_launched)
    veth = net.veth_name(int(cluster.provider_state["slot"]), node.index)
    # the veth first (both ends go at once), then the namespace: a namespace's own teardown is
    # asynchronous and would free the veth's name only some time later
    sysops.run_batch(net.ip_batch_argv(force=True), [f"link del {veth}", f"netns del {ns}"], check=False)
    if sysops.netns_exists(ns) or sysops.link_exists(veth):
        raise ProviderError(f"could not remove {node.name}'s namespace {ns} or veth {veth}",
                            hint=f"see `ip netns pids {ns}`; then run `clustertool replace {node.name}` again")
    return killed


def _undo(cluster: ClusterRecord, old: Node, node_dir: Path, staging: Path, attic: Path) -> None:
    """Remove every part of the new node; the old node's directory goes back (the node stays down)."""
    try:
        remove_node(cluster, old)
    finally:
        cluster.provider_state.get("pids", {}).pop(old.name, None)
        if attic.exists():
            shutil.rmtree(node_dir, ignore_errors=True)
            attic.rename(node_dir)
        shutil.rmtree(staging, ignore_errors=True)


def _host_keys(keygen: subprocess.Popen[bytes], node_dir: Path, name: str) -> list[str]:
    _, err = keygen.communicate(timeout=60)
    if keygen.returncode != 0:
        raise ProviderError(f"ssh-keygen failed for the new {name}: {err.decode(errors='replace').strip()}")
    kind, blob = (node_dir / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()[:2]
    return [f"{kind} {blob}"]


def _wait(cluster: ClusterRecord, node: Node, pid: int, timeout: float = WAIT_S) -> None:
    """Until the new node's sshd answers (members behind the leader: from the leader's namespace)."""
    if nodes.behind_leader(cluster) and node.role != LEADER:
        firewall.wait_members(cluster, [node], timeout)
        return
    deadline = time.monotonic() + timeout
    while not sysops.accepts(node.address, node.ssh_port):
        nodes.reap_launched()
        stopped = not sysops.alive(pid)
        if stopped or time.monotonic() > deadline:
            log = Path(cluster.provider_state["nodes_dir"]) / node.name / "node.log"
            what = "stopped" if stopped else f"did not accept SSH within {timeout:.0f}s"
            raise ProviderError(f"the new {node.name} ({node.address}:22) {what}",
                                hint=f"its log {log} ends: {sysops.log_tail(log)}")
        time.sleep(0.02)
