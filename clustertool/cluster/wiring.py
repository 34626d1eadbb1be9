"""SSH wiring of a cluster's nodes: pinned host keys, this machine's ssh config and known_hosts, the cluster key
and config on every node, the hostfile; the leader's mesh checked; this machine's connections closed; the key
taken back from machines the cluster does not own; host keys collected again (`repin`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import RemoteError
from clustertool.core.hostfile import render_cluster
from clustertool.core.model import ClusterRecord, GroupResult, Node
from clustertool.remote import access, keys, mesh, mux, reach
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import control_exit_argv, forget_warm, master_socket, write_ssh_config


def hostfile_dir() -> Path:
    return Path(os.environ.get("CLUSTERTOOL_HOSTFILE_DIR") or Path.cwd() / "hostfiles")


def write_hostfile(cluster: ClusterRecord) -> Path:
    directory = hostfile_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / cluster.name
    path.write_text(render_cluster(cluster, "openmpi"))
    cluster.hostfile_path = str(path.resolve())
    return path


def wire(session: ClusterSession) -> GroupResult:
    """Pin host keys, write local ssh config, push key + known_hosts + config to every node.

    Members behind the leader are waited for, and (without keys from the provider) scanned, from
    the leader: this also opens the one persistent connection to it that theirs ride on."""
    cluster = session.record
    reach.wait_behind_jumps(session)
    keys.pin_host_keys(session)
    state.save(cluster)
    keys.write_local_known_hosts(cluster)
    write_ssh_config(cluster)
    paths = state.ClusterPaths(cluster.name)
    private, public = paths.key.read_text(), paths.pubkey.read_text()
    leader = cluster.leader.name
    # the same program for every member (and one for the leader, with its hostfile): made once,
    # not once per node, since each holds every node's host keys (O(n) each, O(n^2) if repeated)
    member_script = keys.wire_script(cluster, private, public, None).encode()
    leader_script = keys.wire_script(cluster, private, public, render_cluster(cluster, "openmpi")).encode()

    def script(node: Node) -> bytes:
        return leader_script if node.name == leader else member_script

    result = run_on_nodes(session, cluster.nodes, "sh -s", stdin_data=script, timeout=60)
    raise_on_failures(result, "wiring SSH")
    check_leader_mesh(session)
    return result


def check_leader_mesh(session: ClusterSession) -> None:
    """The leader must reach every node by private address without a prompt (mpirun needs it):
    real ssh to every node, or past mesh.LEADER_FULL_MAX nodes to a sample and an SSH banner
    check of every other node (nodeprogs/reach.py; remote/mesh.py says why that suffices)."""
    cluster = session.record
    by_ssh, by_banner = mesh.leader_targets(cluster.nodes)
    program = nodeprogs.program_text("reach", {"ssh": [n.address for n in by_ssh],
                                               "banner": [n.address for n in by_banner],
                                               "port": 22, "timeout": 10})
    result = run_on_nodes(session, [cluster.leader], nodeprogs.python_command(), timeout=60, stdin_data=program)
    raise_on_failures(result, "checking the leader's SSH mesh")
    by_addr = {n.address: n.name for n in cluster.nodes}
    failed = mesh.failed_targets(result.results[0].stdout)
    if failed:
        detail = "; ".join(f"{by_addr.get(a, a)}: {why}" for a, why in failed.items())
        raise RemoteError(f"the leader cannot ssh to {detail}",
                          hint="check sshd and the cluster security group / firewall")


def raise_on_failures(result: GroupResult, what: str) -> None:
    bad = result.failed()
    if bad:
        detail = "; ".join(f"{r.node}: {r.reason}" for r in bad)
        raise RemoteError(f"{what} failed on {len(bad)} node(s): {detail}")


def close_masters(cluster: ClusterRecord) -> None:
    """Close this machine's ControlMaster connections to the cluster's nodes: each is asked over
    its socket (remote/mux.py, no process per node); ``ssh -O exit`` where that does not answer,
    and for the master to the user's bastion (alias <cluster>-jump), which the others ride on."""
    forget_warm(cluster.name)
    paths = state.ClusterPaths(cluster.name)
    if not paths.ssh_config.exists() or not paths.control_dir.exists():
        return
    left = []
    for node in cluster.nodes:
        path = master_socket(cluster.name, node)
        if path is None or (path.exists() and not mux.terminate(path)):
            left.append(node)
    if access.jump(cluster):
        left.append(Node("jump", 0, ""))
    procs = [subprocess.Popen(control_exit_argv(cluster.name, n), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for n in left]
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def unwire(session: ClusterSession) -> list[str]:
    """Remove the cluster key and config block from machines we do not own."""
    cluster = session.record
    public = state.ClusterPaths(cluster.name).pubkey
    if not public.exists() or not state.ClusterPaths(cluster.name).ssh_config.exists():
        return []
    script = keys.unwire_script(cluster, public.read_text()).encode()
    result = run_on_nodes(session, cluster.nodes, "sh -s", stdin_data=script, timeout=30)
    return [f"{r.node}: removed clustertool key and ssh config" if r.ok
            else f"{r.node}: could not remove clustertool key ({r.reason})"
            for r in result.results]


def repin(session: ClusterSession, node_names: list[str] | None = None) -> list[str]:
    """Forget and re-collect host keys (after a node was legitimately rebuilt)."""
    with session.locked(purpose="repin") as cluster:
        changed = []
        for node in cluster.nodes:
            if node_names is None or node.name in node_names:
                node.host_keys = []
                changed.append(node.name)
        wire(session)
        state.save(cluster)
        return changed
