"""A job is planned into an immutable plan, and the user's options are never written to."""

from __future__ import annotations

import dataclasses

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs.jobplan import JobPlan, plan_job
from clustertool.jobs.mpirun import MpiOptions
from clustertool.jobs.scripts import rank_host

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


def _wrapper_env(rank: int, local: int, size: int, local_size: int, starts: str, tmp_path) -> dict[str, str]:
    """What the rank wrapper exports, run with sh as mpirun runs it, from Open MPI's variables."""
    import os
    import subprocess

    from clustertool.jobs.mpirun import RANK_WRAPPER

    env = dict(os.environ, HOME=str(tmp_path), CLUSTERTOOL_JOB="j1", OMPI_COMM_WORLD_RANK=str(rank),
               OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_SIZE=str(size),
               OMPI_COMM_WORLD_LOCAL_SIZE=str(local_size), CLUSTERTOOL_RANK_STARTS=starts)
    out = subprocess.run(["sh", "-c", RANK_WRAPPER, "ct-rank", "env"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("rank,local,node", [(0, 0, "0"), (1, 1, "0"), (2, 0, "1"), (5, 0, "2"), (6, 1, "2")])
def test_every_rank_gets_the_variables_env_init_reads(tmp_path, rank, local, node):
    got = _wrapper_env(rank, local, 7, 2, "0 2 5", tmp_path)
    assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"], got["LOCAL_WORLD_SIZE"]) == (
        str(rank), str(local), "7", "2")
    assert got["NODE_RANK"] == got["CLUSTERTOOL_NODE_RANK"] == node and got["CLUSTERTOOL_GPUS_PER_NODE"] == "2"


def test_the_job_wide_variables_count_only_nodes_that_get_ranks():
    servers = [Node("server-1", 3, "10.213.0.3", role="server", slots=0)]
    plan = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["python", "t.py"], np=3), "j1",
                    servers=servers)
    env = plan.options.rank_env
    assert env == {"MASTER_ADDR": "10.213.0.1", "MASTER_PORT": "PORT", "NNODES": "2", "CLUSTERTOOL_NUM_NODES": "2",
                   "CLUSTERTOOL_NODE_IPS": "10.213.0.1\n10.213.0.2", "CLUSTERTOOL_RANK_STARTS": "0 2",
                   "OMP_NUM_THREADS": "1", "CLUSTERTOOL_RANK_HOST": rank_host()}
    one = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["true"], np=2), "j1").options.rank_env
    assert one["NNODES"] == "1" and one["CLUSTERTOOL_NODE_IPS"] == "10.213.0.1"   # 2 ranks fill the leader
    per = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["true"], per_node=1), "j1").options.rank_env
    assert per["CLUSTERTOOL_RANK_STARTS"] == "0 1"
    assert "OMP_NUM_THREADS" not in per   # one rank a node keeps every core's thread


def test_several_ranks_a_node_get_one_openmp_thread_each_unless_the_user_says_otherwise():
    """What torchrun does; unset, the ranks' thread pools overload the node."""
    plan = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["python", "t.py"]), "j1")
    assert "OMP_NUM_THREADS=1" in plan.argv
    own = plan_job(_cluster(), _cluster().nodes, MpiOptions(command=["python", "t.py"], env=["OMP_NUM_THREADS=4"]),
                   "j1")
    assert "OMP_NUM_THREADS=4" in own.argv and "OMP_NUM_THREADS=1" not in own.argv
    final = plan.with_facts("/root", master_port=41234)
    assert "MASTER_PORT=41234" in final.argv and "MASTER_PORT=PORT" in plan.argv
