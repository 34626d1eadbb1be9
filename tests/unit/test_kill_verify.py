"""`kill` orchestration over a scripted transport: every node of the job is asked, what each one
reports left behind (processes, GPU memory) decides "clean", a node that cannot be reached or
whose kill did not run to its end is never called clean, and the job ends up recorded as killed.

The nodes' answers are scripted; the real kill runs against MPI jobs on sshd in tests/local/test_jobs.py.
"""

from __future__ import annotations

import base64
import json

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import JobRecord
from clustertool.jobs import kill, records
from tests.fakes.cluster import saved_job
from tests.fakes.transport import Call, Reply, ScriptedTransport

pytestmark = pytest.mark.unit

JOB = "j0101-abc123"


def job_line(alive: bool, killed: bool, job: JobRecord) -> str:
    """One line of the leader's job status program (see jobs.scripts.status_script)."""
    record = base64.b64encode(json.dumps(job.to_dict()).encode()).decode()
    return f"J {job.id} - {int(alive)} {int(killed)} 1 0 {record}\n"


def asks_jobs(call: Call) -> bool:
    return 'echo "J $j' in (call.stdin or "")


def kills(call: Call) -> bool:
    return 'echo "signaled' in (call.stdin or "")


@pytest.fixture
def job(ct_env) -> JobRecord:
    return saved_job(JOB, "kv", 3, np=3)


@pytest.fixture
def fake(tmp_path, job):
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(asks_jobs, Reply(job_line(True, False, job)), times=1)  # before: running
    fake.on(asks_jobs, Reply(job_line(False, True, job)))  # after: killed
    return fake


def test_what_a_node_reports_left_decides_clean_and_every_node_of_the_job_is_asked(fake):
    fake.on(kills, Reply("signaled 101 102\nforced \nremaining \ngpu none\n"), node="node-1")
    fake.on(kills, Reply("signaled 201\nforced 201\nremaining 201:python3\ngpu checked 201:1024\n"), node="node-2")
    fake.on(kills, Reply.unreachable("10.0.0.3"), node="node-3")
    result = kill.kill(ClusterSession.load("kv", transport=fake), JOB, grace=2)

    nodes = {n.node: n for n in result.nodes}
    assert nodes["node-1"].clean and nodes["node-1"].signaled == [101, 102]
    assert nodes["node-2"].remaining == ["201:python3"] and nodes["node-2"].gpu == "held: 201:1024"
    assert nodes["node-3"].error == "unreachable: connection refused"
    assert not nodes["node-2"].clean and not nodes["node-3"].clean and not result.clean
    sent = [c for c in fake.calls if kills(c)]
    assert sorted(c.node for c in sent) == ["node-1", "node-2", "node-3"]
    assert all(f"JOB={JOB}\n" in c.stdin and "SIGNAL=TERM\nTENTHS=20\n" in c.stdin for c in sent)
    assert result.job.state == "killed"


def test_a_node_whose_kill_program_fails_is_not_called_clean(fake):
    fake.on(kills, Reply(stderr="sh: 1: cannot fork: Resource temporarily unavailable\n", code=2), node="node-2")
    fake.on(kills, Reply("signaled 7\nforced \nremaining \ngpu none\n"))
    result = kill.kill(ClusterSession.load("kv", transport=fake), JOB)
    node2 = next(n for n in result.nodes if n.node == "node-2")
    assert node2.error == "exit 2: sh: 1: cannot fork: Resource temporarily unavailable"
    assert not result.clean


def test_with_the_leader_unreachable_the_job_is_recorded_killed_here(tmp_path, job):
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: True, Reply.unreachable("10.0.0.1"), node="node-1")
    fake.on(kills, Reply("signaled 5\nforced \nremaining \ngpu none\n"))
    result = kill.kill(ClusterSession.load("kv", transport=fake), JOB)
    assert result.job.state == "killed" and not result.clean
    assert [j.state for j in records.load_all("kv")] == ["killed"]
