"""Undo everything the local provider made for a cluster; idempotent, safe on half-made clusters.

What is removed is the union of what ``provider_state`` recorded and what can be derived:
namespaces named ``ct-<cluster>-<i>`` and links of the cluster's slot that carry the
cluster's alias tag (``net.link_tag``), so an ``up`` interrupted anywhere is undone
and another cluster's links are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

from clustertool.core import state
from clustertool.core.errors import ProviderError
from clustertool.core.model import ClusterRecord
from clustertool.core.nodeset import fold
from clustertool.providers.local import localfs, net, sysops

_RECORDED = ("token", "slot", "bridge", "route", "count", "netns", "veths", "pids", "nodes_dir")


def _alias(link: str) -> str:
    try:
        return Path("/sys/class/net", link, "ifalias").read_text().strip()
    except OSError:
        return ""


def _fold(names: list[str]) -> str:
    return f"{fold(names)} ({len(names)})" if len(names) > 1 else names[0]


def _our_namespaces(cluster: ClusterRecord) -> list[str]:
    pattern = net.netns_pattern(cluster.name)
    names = set(cluster.provider_state.get("netns", []))
    names |= {ns for ns in sysops.netns_list() if pattern.match(ns)}
    present = [ns for ns in names if sysops.netns_exists(ns)]
    return sorted(present, key=lambda ns: int(m.group(1)) if (m := pattern.match(ns)) else 0)


def _our_links(cluster: ClusterRecord, tag: str) -> list[str]:
    ps = cluster.provider_state
    names = set(ps.get("veths", []))
    if ps.get("slot") is not None:
        pattern = net.veth_pattern(int(ps["slot"]))
        with contextlib.suppress(FileNotFoundError):
            names |= {n for n in os.listdir("/sys/class/net") if pattern.match(n)}
    return sorted(n for n in names if sysops.link_exists(n) and _alias(n) == tag)


def _release_shared(bridge: str | None, tag: str) -> list[str]:
    """Under the global lock: our bridge; the guard route and /scratch when no cluster is left."""
    removed = []
    with sysops.global_lock():
        if bridge and sysops.link_exists(bridge) and net.carries(_alias(bridge), tag):
            sysops.run(["ip", "link", "del", bridge])
            removed.append(f"deleted bridge {bridge}")
        if not net.slots_in_use(sysops.bridge_names()):
            if sysops.route_present():
                sysops.run(net.route_del_argv(), check=False)
                removed.append(f"removed route unreachable {net.NET_RANGE} (no local cluster left)")
            scratch = sysops.release_scratch()
            if scratch:
                removed.append(scratch)
            removed += localfs.release_mountpoints()
    return removed


def teardown(cluster: ClusterRecord, reap: Callable[[], None] = lambda: None, files: bool = True) -> list[str]:
    """Remove the cluster's namespaces, processes, links and (``files``) its node directories."""
    ps = cluster.provider_state
    nodes_dir = Path(ps.get("nodes_dir") or state.ClusterPaths(cluster.name).root / "local")
    if not ps.get("token"):
        return []  # run_instances never began: nothing of ours exists
    tag = net.link_tag(cluster.name, ps["token"])
    removed: list[str] = []
    namespaces = _our_namespaces(cluster)
    killed: list[int] = []
    for _ in range(5):  # again until none is found: a node started a moment ago may be mid-launch
        pids = {p for group in sysops.pids_in_netns(namespaces).values() for p in group}
        pids.update(sysops.pids_starting_nodes_of(nodes_dir))
        pids.difference_update(killed)
        if not pids:
            break
        killed += sysops.kill_all(sorted(pids), reap=reap)
    if killed:
        removed.append(f"killed {len(killed)} node process(es) (PID 1, sshd, sessions)")
    links = _our_links(cluster, tag)
    if namespaces or links:
        sysops.run_batch(net.ip_batch_argv(force=True), net.teardown_lines(namespaces, links, None), check=False)
    if namespaces:
        removed.append(f"deleted network namespaces {_fold(namespaces)}")
    if links:
        removed.append(f"deleted veths {_fold(links)}")
    removed += _release_shared(ps.get("bridge"), tag)
    if files and nodes_dir.exists():
        shutil.rmtree(nodes_dir)
        removed.append(f"removed node directories {nodes_dir}")
    # a link still carrying our tag: once the bridge is gone another cluster may take the slot at
    # once and make links of the same names (its own tag), which are not ours to report
    left = [ns for ns in namespaces if sysops.netns_exists(ns)] + \
        [ln for ln in links if sysops.link_exists(ln) and _alias(ln) == tag]
    if left:
        raise ProviderError(f"could not remove {_fold(left)}", hint="run `clustertool down` again")
    for key in _RECORDED:
        ps.pop(key, None)
    return removed
