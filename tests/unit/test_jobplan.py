"""A job is planned into an immutable plan, and the user's options are never written to."""

from __future__ import annotations

import dataclasses

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs.jobplan import JobPlan, plan_job
from clustertool.jobs.mpirun import MpiOptions

pytestmark = pytest.mark.unit


def _cluster() -> ClusterRecord:
    return ClusterRecord("c", "local", user="root", status="ready", nodes=[
        Node("node-1", 1, "10.213.0.1", role="leader", slots=2), Node("node-2", 2, "10.213.0.2", slots=2)])


def test_planning_leaves_the_users_options_as_they_were():
    opts = MpiOptions(command=["python train.py --lr 0.1"], env=["A=1"])
    before = dataclasses.replace(opts)
    plan = plan_job(_cluster(), _cluster().nodes, opts, "j1", plugin_env={"NCCL_NET_PLUGIN": "clustertool"})
    assert opts == before                                   # nothing written back
    assert plan.options.command == ["python", "train.py", "--lr", "0.1"] and plan.options.job_id == "j1"
    assert plan.options.subnet == "10.213.0.0/24" and plan.options.as_root
    assert "--hostfile" in plan.argv and "$HOME/.clustertool/jobs/j1/hostfile" in plan.argv
    assert plan.hostfile == "10.213.0.1 slots=2\n10.213.0.2 slots=2\n" and plan.np == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.job_id = "j2"  # type: ignore[misc]


def test_facts_from_the_nodes_make_a_new_plan():
    plan = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["true"]), "j1",
                    plugin_env={"CLUSTERTOOL_SERVERS": "10.0.0.9:PORT"})
    final = plan.with_facts("/root", {"CLUSTERTOOL_SERVERS": "10.0.0.9:41000"})
    assert isinstance(final, JobPlan) and final is not plan and plan.home == "$HOME"
    assert "/root/.clustertool/jobs/j1/hostfile" in final.argv and final.options.output_dir == \
        "/root/.clustertool/jobs/j1/out"
    assert "CLUSTERTOOL_SERVERS=10.0.0.9:41000" in " ".join(final.argv)
    assert "CLUSTERTOOL_SERVERS=10.0.0.9:PORT" in " ".join(plan.argv)   # the first plan is unchanged


def test_sync_sets_the_working_directory_and_conflicts_are_one_line():
    plan = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["true"]), "j1", sync=("/here", "/there"))
    assert plan.options.workdir == "/there" and ["-wdir", "/there"] == plan.argv[plan.argv.index("-wdir"):][:2]
    with pytest.raises(UsageError, match="--sync sets the working directory"):
        plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["true"], workdir="/else"), "j1",
                 sync=("/here", "/there"))
    with pytest.raises(UsageError, match="must include the leader"):
        plan_job(_cluster(), _cluster().nodes[1:], MpiOptions(command=["true"]), "j1")
    with pytest.raises(UsageError, match="no command given"):
        plan_job(_cluster(), _cluster().nodes, MpiOptions(command=[]), "j1")
