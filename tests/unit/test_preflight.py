"""`run`'s preflight: a job still running refuses the start; the last processes of a job that has
ended (the previous one of a loop of jobs, e.g. `bench scaling`) get a moment to go.

Nodes are ScriptedTransport homes: the scan's answer is scripted, the leader's job folder is real."""

from __future__ import annotations

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.jobs import launch
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Reply, ScriptedTransport

pytestmark = pytest.mark.unit


def scanning(fake, answers):
    """Scans answer from ``answers`` in turn (the last one from then on): the job ids seen running."""
    seen = []

    def reply(call):
        ids = answers[min(len(seen), len(answers) - 1)]
        seen.append(call.node)
        return Reply("home=/home/u\nport=41234\n" + "".join(f"running CLUSTERTOOL_JOB={i}\n" for i in ids))
    fake.on(lambda c: c.stdin is not None and "CLUSTERTOOL_JOB" in c.stdin, reply)
    return seen


def ended(fake, job_id):
    d = fake.home("node-1") / ".clustertool" / "jobs" / job_id
    d.mkdir(parents=True)
    (d / "exit").write_text("0\n")


def test_leftovers_of_a_job_that_ended_are_waited_for(ct_env, tmp_path):
    c = saved_cluster("pf", 2)
    fake = ScriptedTransport(tmp_path / "nodes")
    ended(fake, "j1-aaaa")
    seen = scanning(fake, [["j1-aaaa"], ["j1-aaaa"], []])
    assert launch.preflight(ClusterSession(c, fake), c.nodes, False) == ("/home/u", 41234)
    assert len(seen) > 2  # scanned again until they were gone


def test_a_job_still_running_refuses_at_once_and_names_it(ct_env, tmp_path):
    c = saved_cluster("pf", 2)
    fake = ScriptedTransport(tmp_path / "nodes")
    seen = scanning(fake, [["j2-bbbb"]])
    with pytest.raises(UsageError, match=r"job j2-bbbb is still running on node-\[1-2\]") as exc:
        launch.preflight(ClusterSession(c, fake), c.nodes, False)
    assert len(seen) == 2  # no exit recorded: no waiting
    assert "clustertool kill j2-bbbb" in exc.value.hint


def test_leftovers_that_outlive_the_grace_are_refused_with_the_fix(ct_env, tmp_path):
    c = saved_cluster("pf", 2)
    fake = ScriptedTransport(tmp_path / "nodes")
    ended(fake, "j3-cccc")
    scanning(fake, [["j3-cccc"]])
    with pytest.raises(UsageError, match="job j3-cccc has ended but processes of it are still on node-") as exc:
        launch.preflight(ClusterSession(c, fake), c.nodes, False, grace=0.5)
    assert "doctor --fix" in exc.value.hint
