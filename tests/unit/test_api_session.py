"""The Python API's Cluster is the session every command makes: handed a scripted transport
(clustertool.remote.testing, shipped with the package), the same core code runs without ssh."""

from __future__ import annotations

import pytest

from clustertool import Cluster
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.remote.testing import Reply, ScriptedTransport
from tests.fakes.cluster import saved_cluster

pytestmark = pytest.mark.unit


def test_a_cluster_with_a_scripted_transport_runs_exec_without_ssh(ct_env, tmp_path):
    record = saved_cluster("api", 3)
    fake = ScriptedTransport(tmp_path / "nodes").on("hostname", Reply("n2\n"), node="node-2")
    cluster = Cluster(record, transport=fake)
    assert isinstance(cluster, ClusterSession) and cluster.name == "api" and cluster.transport is fake
    result = cluster.exec("hostname", nodes="node-[2-3]")
    assert [(r.node, r.ok) for r in result.results] == [("node-2", True), ("node-3", True)]
    assert result.by_node()["node-2"].stdout == "n2\n"
    assert [c.node for c in fake.calls] == ["node-2", "node-3"]   # every call went through the transport


def test_the_session_reads_its_record_again_and_checks_readiness(ct_env):
    record = saved_cluster("rd", 2)
    session = ClusterSession.load("rd")
    record.status = "stopped"
    state.save(record)
    assert session.ready() is session.record          # the record it was made with
    with pytest.raises(Exception, match="is stopped, not ready for SSH"):
        session.reload()
        session.ready()
    with session.locked() as fresh:
        assert fresh.status == "stopped" and session.record is fresh
