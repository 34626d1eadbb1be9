"""Ranks in network-topology order (cluster/topology_order.py): the pure ordering, renumbering, and the
hostfile it gives."""

from __future__ import annotations

from clustertool.cluster import topology_order
from clustertool.core.hostfile import render_cluster
from clustertool.core.model import LEADER, SERVER, ClusterRecord, Node


def _nodes(n: int, servers: int = 0) -> list[Node]:
    out = [Node(f"node-{k}", k, f"10.0.0.{k}", LEADER if k == 1 else "member", slots=8) for k in range(1, n + 1)]
    out += [Node(f"server-{j}", n + j, f"10.0.1.{j}", SERVER, slots=0) for j in range(1, servers + 1)]
    return out


def _eight_under_two(nodes: list[Node]) -> dict[str, list[str]]:
    """A DescribeInstanceTopology answer as recorded: launch order alternates between two network nodes."""
    return {n.name: ["nn-spine", "nn-agg-1", "nn-a" if n.index % 2 else "nn-b"] for n in nodes if n.index <= 8}


class _Provider:
    def __init__(self, paths):
        self.paths = paths

    def topology(self, cluster):
        return self.paths


def test_eight_nodes_under_two_network_nodes_get_adjacent_ranks_with_the_leader_first():
    nodes = _nodes(8)
    order = topology_order.rank_order(nodes, _eight_under_two(nodes))
    assert [n.name for n in order] == ["node-1", "node-3", "node-5", "node-7", "node-2", "node-4", "node-6", "node-8"]


def test_the_leaders_network_node_comes_first_and_groups_nest_by_layer():
    nodes = _nodes(6)
    paths = {"node-1": ["s2", "a3", "x"], "node-2": ["s1", "a1", "y"], "node-3": ["s2", "a4", "z"],
             "node-4": ["s2", "a3", "x"], "node-5": ["s1", "a1", "y"], "node-6": ["s2", "a4", "w"]}
    order = [n.name for n in topology_order.rank_order(nodes, paths)]
    assert order == ["node-1", "node-4", "node-3", "node-6", "node-2", "node-5"]


def test_nodes_without_a_path_go_last_and_a_leader_without_one_still_leads():
    nodes = _nodes(4)
    assert [n.name for n in topology_order.rank_order(nodes, {"node-2": ["a"], "node-4": ["b"], "node-3": ["a"]})] == \
        ["node-1", "node-2", "node-3", "node-4"]
    assert [n.name for n in topology_order.rank_order(nodes, {"node-1": ["a"], "node-3": ["a"]})] == \
        ["node-1", "node-3", "node-2", "node-4"]


def test_arrange_renumbers_records_paths_and_the_hostfile_follows_servers_untouched():
    cluster = ClusterRecord("t", "aws", nodes=_nodes(8, servers=1))
    paths = _eight_under_two(cluster.nodes)
    lines: list[str] = []
    topology_order.arrange(cluster, _Provider(paths), lines.append)
    hosts = [line.split()[0] for line in render_cluster(cluster, "openmpi").splitlines()
             if line.strip() and not line.startswith("#")]
    assert hosts == [f"10.0.0.{k}" for k in (1, 3, 5, 7, 2, 4, 6, 8)]
    assert [n.name for n in cluster.workers] == [f"node-{k}" for k in range(1, 9)]
    assert cluster.node("node-2").address == "10.0.0.3" and cluster.node("node-2").extra["renumbered_from"] == "node-3"
    assert cluster.leader.name == "node-1" and "renumbered_from" not in cluster.leader.extra
    assert cluster.node("server-1").index == 9
    assert cluster.node("node-5").extra["network_nodes"] == ["nn-spine", "nn-agg-1", "nn-b"]
    assert [g["nodes"] for g in topology_order.groups(cluster)] == [["node-1", "node-2", "node-3", "node-4"],
                                                            ["node-5", "node-6", "node-7", "node-8"]]
    assert "nn-a: node-1, node-2, node-3, node-4; nn-b: node-5" in lines[0]
    assert topology_order.status_extra(cluster)["topology"].startswith("2 network node(s): nn-a: node-1")


def test_no_topology_order_records_the_paths_but_keeps_launch_order():
    cluster = ClusterRecord("t", "aws", nodes=_nodes(8), options={"no_topology_order": True})
    topology_order.arrange(cluster, _Provider(_eight_under_two(cluster.nodes)))
    assert [n.address for n in cluster.workers] == [f"10.0.0.{k}" for k in range(1, 9)]
    assert cluster.node("node-2").extra["network_nodes"][-1] == "nn-b"
    assert "launch order" in topology_order.status_extra(cluster)["topology"]


def test_a_provider_that_cannot_say_leaves_everything_as_launched():
    cluster = ClusterRecord("t", "aws", nodes=_nodes(4))
    topology_order.arrange(cluster, _Provider({}))
    assert [n.name for n in cluster.workers] == ["node-1", "node-2", "node-3", "node-4"]
    assert topology_order.groups(cluster) == [] and topology_order.status_extra(cluster) == {}
