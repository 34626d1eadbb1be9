"""Which environment a job's ranks get (issue 33: `python: not found` on a fresh local cluster):
on a local cluster the user's own (its virtualenv first), elsewhere the nodes' own; the plan carries it,
-x PATH=... wins, and a program the ranks cannot find stops the job at preflight, named, with a hint."""

from __future__ import annotations

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, Node
from clustertool.jobs import launch
from clustertool.jobs.jobplan import plan_job
from clustertool.jobs.mpirun import MpiOptions, env_items
from clustertool.providers.base import IMAGE_PYTHON, Provider
from clustertool.providers.local import userenv
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Reply, ScriptedTransport

pytestmark = pytest.mark.unit


def test_the_active_virtualenv_comes_first_then_this_machines_path(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    env = userenv.user_environment({"VIRTUAL_ENV": str(venv), "PATH": f"/opt/x/bin::.:{venv}/bin:/usr/bin"},
                                   "/usr", "/usr")
    assert env.env["VIRTUAL_ENV"] == str(venv)
    assert env.env["PATH"].split(":")[:3] == [f"{venv}/bin", "/opt/x/bin", "/usr/bin"]  # no '' or '.' entries
    assert env.python.startswith(f"{venv}/bin/python (the virtualenv {venv}")


def test_without_an_activated_one_the_virtualenv_clustertool_runs_from():
    assert userenv.active_virtualenv({}, "/work/p/.venv", "/usr") == "/work/p/.venv"
    assert userenv.active_virtualenv({}, "/usr", "/usr") is None


def _cluster(n: int) -> ClusterRecord:
    return ClusterRecord("pe", "static", status="ready", nodes=[
        Node(f"node-{i}", i, f"10.0.0.{i}", role=LEADER if i == 1 else MEMBER) for i in range(1, n + 1)])


def test_other_providers_hand_the_ranks_nothing_the_images_environment_counts():
    env = Provider().rank_environment(_cluster(2))
    assert env.env == {} and env.python == IMAGE_PYTHON


def _plan(env: list[str], node_env: dict[str, str]):
    c = _cluster(2)
    return plan_job(c, c.nodes, MpiOptions(["python", "t.py"], env=env), "j1-abcd", node_env=node_env)


def test_the_ranks_get_the_providers_environment_and_a_users_x_wins():
    mine = {"PATH": "/v/bin:/usr/bin", "VIRTUAL_ENV": "/v"}
    items = env_items(_plan([], mine).options)
    assert "PATH=/v/bin:/usr/bin" in items and "VIRTUAL_ENV=/v" in items
    items = env_items(_plan(["PATH=/opt/bin:/usr/bin"], mine).options)
    assert [i for i in items if i.startswith("PATH")] == ["PATH=/opt/bin:/usr/bin"]
    assert _plan(["PATH=/opt/bin"], mine).rank_path == "/opt/bin"
    assert _plan(["PATH"], mine).rank_path is None  # the leader's own PATH: the nodes' environment


@pytest.mark.parametrize("command,program", [
    (["python", "t.py"], "python"), (["torchrun", "t.py"], "torchrun"),
    (["python3", "-m", "torch.distributed.run", "t.py"], "python3"), (["accelerate", "launch", "t.py"], "accelerate"),
])
def test_the_program_a_job_starts_is_what_preflight_looks_for(command, program):
    c = _cluster(2)
    assert plan_job(c, c.nodes, MpiOptions(command), "j1-abcd").program == program


def test_a_program_the_nodes_cannot_find_stops_the_job_at_preflight_named(ct_env, tmp_path):
    c = saved_cluster("pm", 3)
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda call: call.stdin is not None and "command -v" in call.stdin,
            lambda call: Reply("home=/root\nport=41234\n" + ("" if call.node == "node-1" else "missing=python\n")))
    with pytest.raises(UsageError) as err:
        launch.preflight(ClusterSession(c, fake), c.nodes, False, program="python", path="/v/bin:/usr/bin")
    assert err.value.message == "python: not found on node-[2-3] (the ranks' PATH there)"
    assert "full path" in err.value.hint and "-x PATH=" in err.value.hint and len(err.value.hint) < 160
    assert "PATH=/v/bin:/usr/bin" in fake.calls[0].stdin
