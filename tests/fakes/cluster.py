"""A cluster that exists only as a state file (for orchestration tests over a scripted transport)."""

from __future__ import annotations

import time

from clustertool.core import state
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, JobRecord, Node
from clustertool.jobs import records


def saved_cluster(name: str, nodes: int, provider: str = "static") -> ClusterRecord:
    """``nodes`` nodes node-1 (leader) .. node-N at 10.0.0.1 .., status ready, saved in CLUSTERTOOL_HOME."""
    cluster = ClusterRecord(name, provider, status="ready", nodes=[
        Node(f"node-{i}", i, f"10.0.0.{i}", role=LEADER if i == 1 else MEMBER) for i in range(1, nodes + 1)])
    state.save(cluster)
    return cluster


def saved_job(job_id: str, cluster: str, nodes: int, np: int) -> JobRecord:
    """A cluster of ``nodes`` nodes (``saved_cluster``) and a job of ``np`` ranks on all of them, started a
    minute ago, in local state (its leader's view comes from the scripted transport)."""
    saved_cluster(cluster, nodes)
    job = JobRecord(job_id, cluster, ["python3", "train.py"], nodes=[f"node-{i}" for i in range(1, nodes + 1)],
                    np=np, leader="node-1", started=time.time() - 60)
    records.save(job)
    return job
