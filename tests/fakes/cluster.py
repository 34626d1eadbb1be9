"""A cluster that exists only as a state file (for orchestration tests over a scripted transport)."""

from __future__ import annotations

from clustertool.core import state
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, Node


def saved_cluster(name: str, nodes: int, provider: str = "static") -> ClusterRecord:
    """``nodes`` nodes node-1 (leader) .. node-N at 10.0.0.1 .., status ready, saved in CLUSTERTOOL_HOME."""
    cluster = ClusterRecord(name, provider, status="ready", nodes=[
        Node(f"node-{i}", i, f"10.0.0.{i}", role=LEADER if i == 1 else MEMBER) for i in range(1, nodes + 1)])
    state.save(cluster)
    return cluster
