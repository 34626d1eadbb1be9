"""Cordons: the mark in the record (old records load as not cordoned), the hostfiles without the node
(this machine's and the leader's, written without reaching the cordoned node), jobs' node selection,
and what `doctor --cordon` takes as a node's error.

Nodes are ScriptedTransport homes: the leader's ~/hostfile is a real file in node-1's home."""

from __future__ import annotations

import json

import pytest

from clustertool.bench.scaling import run_scaling
from clustertool.cluster import cordon
from clustertool.cluster.session import ClusterSession
from clustertool.core import hostfile, nodeset, state
from clustertool.core.errors import UsageError
from clustertool.core.model import SERVER, ClusterRecord, Node
from clustertool.doctor import autocordon
from clustertool.doctor.findings import CheckResult, Diagnosis, Finding
from clustertool.doctor.plugin_check import in_use
from clustertool.jobs import launch
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Reply, ScriptedTransport

pytestmark = pytest.mark.unit


def _record(n: int = 4, cordoned: tuple[str, ...] = ()) -> ClusterRecord:
    c = ClusterRecord("cc", "static", status="ready", nodes=[
        Node(f"node-{i}", i, f"10.0.0.{i}", role="leader" if i == 1 else "member", slots=2) for i in range(1, n + 1)])
    for name in cordoned:
        c.node(name).cordon = cordon.mark("bad GPU")
    return c


def _session(tmp_path, n: int = 4, status: str = "ready") -> tuple[ClusterSession, ScriptedTransport]:
    c = saved_cluster("cc", n)
    c.status = status  # type: ignore[assignment]
    c.hostfile_path = str(tmp_path / "hf" / "cc")
    state.save(c)
    fake = ScriptedTransport(tmp_path / "nodes")
    return ClusterSession(state.load("cc"), fake), fake


def test_a_record_from_before_cordons_loads_with_no_node_cordoned_and_a_cordon_round_trips(ct_env):
    old = _record().to_dict()
    for node in old["nodes"]:
        del node["cordon"]
    assert not any(n.cordoned for n in ClusterRecord.from_dict(old).nodes)
    c = _record(cordoned=("node-3",))
    state.save(c)
    loaded = state.load("cc").node("node-3")
    assert loaded.cordoned and loaded.cordon["reason"] == "bad GPU" and loaded.cordon["by"] == "user"
    assert loaded.cordon["since"] > 0


def test_the_hostfiles_leave_cordoned_nodes_and_servers_out_in_every_format():
    c = _record(cordoned=("node-3",))
    c.nodes.append(Node("server-1", 5, "10.0.0.5", role=SERVER, slots=0))
    assert hostfile.render_cluster(c, "openmpi") == "10.0.0.1 slots=2\n10.0.0.2 slots=2\n10.0.0.4 slots=2\n"
    assert hostfile.render_cluster(c, "deepspeed") == hostfile.render_cluster(c, "openmpi")
    assert hostfile.render_cluster(c, "horovod") == "10.0.0.1:2,10.0.0.2:2,10.0.0.4:2\n"


def test_jobs_default_to_the_nodes_not_cordoned_and_a_group_leaves_them_out():
    c = _record(cordoned=("node-3",))
    assert [n.name for n in launch.rank_nodes(c, None)] == ["node-1", "node-2", "node-4"]
    assert [n.name for n in launch.rank_nodes(c, "workers")] == ["node-1", "node-2", "node-4"]
    assert [n.name for n in launch.rank_nodes(c, "leader,members")] == ["node-1", "node-2", "node-4"]
    # exec and copy select the way they always did: the cordoned node too
    assert [n.name for n in nodeset.select(c, "workers")] == ["node-1", "node-2", "node-3", "node-4"]


@pytest.mark.parametrize("selection", ["node-3", "node-[1-3]", "10.0.0.3"])
def test_a_job_naming_a_cordoned_node_is_refused_naming_the_cordon_and_uncordon(selection):
    c = _record(cordoned=("node-3",))
    with pytest.raises(UsageError) as err:
        launch.rank_nodes(c, selection)
    assert err.value.message == "node-3 is cordoned (bad GPU): jobs do not run there"
    assert "clustertool uncordon node-3" in (err.value.hint or "")


def test_bench_scaling_counts_and_runs_only_nodes_not_cordoned():
    c = _record(cordoned=("node-2",))
    ran = []

    def launch_(nodes, per_node, argv):
        ran.append([n.name for n in nodes])
        return 0, "samples/sec: 10\n", None
    run_scaling(c, [1, 3], 1, ["python3", "t.py"], launch=launch_)
    assert ran == [["node-1"], ["node-1", "node-3", "node-4"]]
    with pytest.raises(UsageError, match=r"has 3 not cordoned \(node-2 is cordoned\)"):
        run_scaling(c, [4], 1, ["python3", "t.py"], launch=launch_)


def test_plugin_check_uses_the_workers_and_servers_not_cordoned():
    c = _record(cordoned=("node-2",))
    c.nodes += [Node("server-1", 5, "10.0.0.5", role=SERVER, slots=0), Node("server-2", 6, "10.0.0.6", role=SERVER,
                                                                              slots=0, cordon=cordon.mark("slow"))]
    assert [n.name for n in in_use(c)] == ["node-1", "node-3", "node-4", "server-1"]
    assert [n.name for n in c.schedulable_servers] == ["server-1"]


def test_cordon_writes_the_record_and_both_hostfiles_without_reaching_the_node(ct_env, tmp_path):
    session, fake = _session(tmp_path)
    result = cordon.cordon(session, "node-3", reason="Xid 79\n  fell off the bus")
    assert (result.changed, result.cordoned, result.leader_hostfile) == (["node-3"], ["node-3"], "written")
    mark = state.load("cc").node("node-3").cordon
    assert mark["reason"] == "Xid 79 fell off the bus" and mark["by"] == "user"
    expected = "10.0.0.1 slots=1\n10.0.0.2 slots=1\n10.0.0.4 slots=1\n"
    assert (tmp_path / "hf" / "cc").read_text() == expected
    assert (fake.home("node-1") / "hostfile").read_text() == expected
    assert [c.node for c in fake.calls] == ["node-1"]  # only the leader was reached
    again = cordon.cordon(session, "node-3", reason="other")
    assert again.changed == [] and again.unchanged == ["node-3"]
    assert state.load("cc").node("node-3").cordon == mark  # the first reason and time stay
    back = cordon.uncordon(session, "node-[3-4]")
    assert (back.changed, back.unchanged, back.cordoned) == (["node-3"], ["node-4"], [])
    full = "10.0.0.1 slots=1\n10.0.0.2 slots=1\n10.0.0.3 slots=1\n10.0.0.4 slots=1\n"
    assert (tmp_path / "hf" / "cc").read_text() == full == (fake.home("node-1") / "hostfile").read_text()
    assert json.loads(json.dumps(back.to_dict()))["cordons"] == {"node-3": None, "node-4": None}


def test_the_leader_cannot_be_cordoned_and_nothing_changes(ct_env, tmp_path):
    session, fake = _session(tmp_path)
    for selection in ("node-1", "all", "node-[1-2]"):
        with pytest.raises(UsageError) as err:
            cordon.cordon(session, selection)
        assert err.value.message.startswith("node-1 is the leader and cannot be cordoned")
        assert "reboot --nodes node-1" in (err.value.hint or "")
    assert state.load("cc").cordoned == [] and fake.calls == []
    with pytest.raises(UsageError, match="has no node node-9"):
        cordon.cordon(session, "node-9")


def test_an_unreachable_leader_or_a_stopped_cluster_still_records_the_cordon(ct_env, tmp_path):
    session, fake = _session(tmp_path)
    fake.on("base64 -d", Reply.unreachable("10.0.0.1"), node="node-1")
    result = cordon.cordon(session, "node-2")
    assert result.leader_hostfile.startswith("not written: node-1: ")
    assert state.load("cc").node("node-2").cordoned and "10.0.0.2 " not in (tmp_path / "hf" / "cc").read_text()
    stopped, fake2 = _session(tmp_path / "s", status="stopped")
    result = cordon.cordon(stopped, "node-2")
    assert result.leader_hostfile == "not written: the cluster is stopped (`start` writes it)" and fake2.calls == []


def test_cordon_of_a_cluster_whose_hostfile_was_never_written_writes_it(ct_env, tmp_path):
    session, _ = _session(tmp_path)
    session.record.hostfile_path = None
    state.save(session.record)
    result = cordon.cordon(session, "node-4")
    assert result.hostfile == str(tmp_path / "hostfiles" / "cc")  # CLUSTERTOOL_HOSTFILE_DIR of ct_env
    assert state.load("cc").hostfile_path == result.hostfile


def _diagnosis(*findings: Finding) -> Diagnosis:
    return Diagnosis("cc", [CheckResult("x", list(findings))])


def test_doctor_cordons_nodes_with_errors_not_links_warnings_or_the_leader():
    c = _record()
    d = _diagnosis(
        Finding("reach", "node-4", "error", "not reachable over SSH: Connection refused"),
        Finding("ssh-mesh", "node-4", "error", "no node can ssh to node-4 (refused)"),
        Finding("links", "node-2", "error", "bandwidth test node-2 <-> node-3 failed: timeout"),
        Finding("links", "node-3", "error", "slow link", data={"link": ["node-3", "node-2"]}),
        Finding("ssh-mesh", "node-3", "error", "node-2 cannot ssh to node-3: refused", data={"from": ["node-2"]}),
        Finding("disk", "node-2", "warning", "10% free"),
        Finding("clock", "node-1", "error", "clock is +9.00s off the other nodes"),
        Finding("mpi-smoke", None, "error", "`mpirun hostname` failed"))
    reasons, skipped = autocordon.reasons(c, d)
    assert reasons == {"node-4": "doctor reach: not reachable over SSH: Connection refused (and 1 more)"}
    assert skipped == [{"node": "node-1", "why": "the leader cannot be cordoned (doctor clock: clock is +9.00s off "
                                                 "the other nodes)"}]


def test_doctor_cordon_marks_the_record_by_doctor_and_notes_cordoned_nodes(ct_env, tmp_path):
    session, fake = _session(tmp_path)
    d = _diagnosis(Finding("disk", "node-3", "error", "/scratch: 0 MiB free"))
    done = autocordon.cordon_errors(session, d)
    assert done.cordoned == {"node-3": "doctor disk: /scratch: 0 MiB free"} and done.leader_hostfile == "written"
    assert state.load("cc").node("node-3").cordon["by"] == "doctor"
    assert autocordon.cordon_errors(session, d).already == ["node-3"]
    [note] = autocordon.notes(state.load("cc"))
    [f] = note.findings
    assert (f.node, f.severity, f.check) == ("node-3", "info", "cordon") and "by doctor: doctor disk" in f.message
    assert f.fix == "`clustertool uncordon node-3` once it is repaired" and note.status == "ok"
    assert autocordon.notes(_record()) == []


def test_a_cordon_survives_start_even_when_the_provider_hands_back_new_nodes(ct_env, tmp_path, monkeypatch):
    """A stand-in provider (AWS's start re-reads every instance into a new Node); wiring is skipped."""
    from clustertool.cluster import lifecycle

    session, _ = _session(tmp_path, status="stopped")
    cordon.cordon(session, "node-2", reason="PCIe x8")

    class Fresh:
        def confirm_owner(self, cluster, force, verb):
            pass

        def start_instances(self, cluster):
            return [Node(n.name, n.index, n.address, role=n.role) for n in cluster.nodes]

        def wait_instances(self, cluster):
            return cluster.nodes

    monkeypatch.setattr("clustertool.cluster.session.get_provider", lambda *a, **k: Fresh())
    monkeypatch.setattr(lifecycle, "wire", lambda session: None)
    started = lifecycle.start(ClusterSession.load("cc"))
    assert [n.name for n in started.cordoned] == ["node-2"] and started.node("node-2").cordon["reason"] == "PCIe x8"
    assert "10.0.0.2 " not in (tmp_path / "hostfiles" / "cc").read_text()
