"""Ranks in network-topology order: nodes under the same network node get adjacent places in the
hostfile (so adjacent ranks, and NCCL's rings and trees, cross fewer network layers).

Where the provider describes the network nodes above each machine (``Provider.topology``: on AWS
DescribeInstanceTopology, for p4d, p5, trn1 and other types), `up` records the path of each node
(``node.extra["network_nodes"]``, outermost layer first) and, unless ``--no-topology-order``,
renumbers the workers in that order: the leader stays node-1 and first; below every network
node, nodes keep their launch order; nodes the provider said nothing about come last.
``rank_order`` is the pure part.
"""

from __future__ import annotations

from typing import Any

from clustertool.core.model import ClusterRecord, Node, Reporter, silent

KEY = "network_nodes"
MOVED = "renumbered_from"


def rank_order(workers: list[Node], paths: dict[str, list[str]]) -> list[Node]:
    """``workers`` (leader first, then launch order) regrouped so nodes that share a network node are
    adjacent at every layer; groups come in order of their first node, so the leader's is first."""
    leader = [n for n in workers if n.is_leader]
    rest = [n for n in workers if not n.is_leader]
    ordered = leader + rest
    known = [n for n in ordered if paths.get(n.name)]
    unknown = [n for n in ordered if not paths.get(n.name)]
    if leader and leader[0] in unknown:  # no path for the leader: it still leads
        unknown.remove(leader[0])
        return [leader[0]] + _grouped(known, paths, 0) + unknown
    return _grouped(known, paths, 0) + unknown


def _grouped(nodes: list[Node], paths: dict[str, list[str]], depth: int) -> list[Node]:
    if len(nodes) <= 1:
        return nodes
    buckets: dict[str | None, list[Node]] = {}
    for node in nodes:
        path = paths[node.name]
        buckets.setdefault(path[depth] if depth < len(path) else None, []).append(node)
    if len(buckets) == 1 and None in buckets:
        return nodes
    return [n for key, group in buckets.items()
            for n in (group if key is None else _grouped(group, paths, depth + 1))]


def renumber(cluster: ClusterRecord, ordered: list[Node]) -> dict[str, str]:
    """Workers take index and name (node-K) from their place in ``ordered``; servers keep theirs.
    Returns old name -> new name for the nodes that moved."""
    moved = {}
    for k, node in enumerate(ordered, start=1):
        new = f"node-{k}"
        if node.name != new:
            moved[node.name] = new
            node.extra[MOVED] = node.extra.get(MOVED, node.name)  # the provider's tags follow (finish)
        node.index, node.name = k, new
    cluster.nodes = ordered + [n for n in cluster.nodes if n.is_server]
    return moved


def arrange(cluster: ClusterRecord, provider: Any, report: Reporter = silent) -> None:
    """After the machines run: record each node's network-node path and (unless --no-topology-order)
    put the workers in topology order.  A provider that cannot say leaves the launch order."""
    workers = [n for n in cluster.ordered_nodes() if not n.is_server]
    if len(workers) < 2:
        return
    paths = provider.topology(cluster)
    if not paths:
        return
    for node in cluster.nodes:
        if paths.get(node.name):
            node.extra[KEY] = list(paths[node.name])
    if cluster.options.get("no_topology_order"):
        report(f"network topology: {describe(cluster)} (launch order kept: --no-topology-order)")
        return
    moved = renumber(cluster, rank_order(workers, paths))
    report(f"network topology: {describe(cluster)}"
           + (f"; hostfile and ranks in that order ({len(moved)} node(s) renumbered)" if moved
              else "; launch order already matches it"))


def groups(cluster: ClusterRecord) -> list[dict[str, Any]]:
    """Workers by the innermost network node above them, in hostfile order (``status --json``)."""
    out: list[dict[str, Any]] = []
    for node in cluster.workers:
        path = node.extra.get(KEY) or []
        leaf = path[-1] if path else None
        if not out or out[-1]["network_node"] != leaf:
            out.append({"network_node": leaf, "path": list(path), "nodes": []})
        out[-1]["nodes"].append(node.name)
    return out if any(g["network_node"] for g in out) else []


def describe(cluster: ClusterRecord) -> str:
    """One line: each innermost network node and the nodes under it, in hostfile order."""
    found = groups(cluster)
    return "; ".join(f"{g['network_node'] or 'unknown'}: {', '.join(g['nodes'])}" for g in found)


def status_extra(cluster: ClusterRecord) -> dict[str, str]:
    found = groups(cluster)
    if not found:
        return {}
    kept = " (launch order: --no-topology-order)" if cluster.options.get("no_topology_order") else ""
    return {"topology": f"{len({g['network_node'] for g in found})} network node(s): {describe(cluster)}{kept}"}
