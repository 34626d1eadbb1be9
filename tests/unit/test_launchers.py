"""Launchers: which one a command names, the user's options kept, each node's command line, and the
leader's fan-out line that starts one job agent per node.  Pure functions: no node involved."""

from __future__ import annotations

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs import launchers
from clustertool.jobs.jobplan import plan_job
from clustertool.jobs.launchers import NodeShare, Rendezvous, detect, node_argv, parse
from clustertool.jobs.mpirun import MpiOptions

pytestmark = pytest.mark.unit


def cluster(nodes=3, slots=2, servers=0):
    ns = [Node(f"node-{i}", i, f"10.0.0.{i}", role="leader" if i == 1 else "member", slots=slots)
          for i in range(1, nodes + 1)]
    ns += [Node(f"server-{i}", nodes + i, f"10.0.1.{i}", role="server", slots=1) for i in range(1, servers + 1)]
    return ClusterRecord(name="c", provider="local", user="root", nodes=ns)


@pytest.mark.parametrize("command,kind", [
    (["torchrun", "train.py"], "torchrun"),
    (["/opt/venv/bin/torchrun", "--max-restarts", "2", "train.py"], "torchrun"),
    (["python3", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["accelerate", "launch", "train.py"], "accelerate"),
    (["deepspeed", "train.py"], "deepspeed"),
    (["python", "train.py"], "mpirun"),
    (["accelerate", "config"], "mpirun"),
    (["python", "-m", "torch.distributed.launch", "x.py"], "mpirun"),
])
def test_the_launcher_a_command_names_by_its_program(command, kind):
    assert detect(command) == kind


def test_torchrun_written_in_the_command_or_chosen_by_flag_plans_the_same():
    written = parse(["torchrun", "train.py", "--lr", "0.1"])
    flagged = parse(["train.py", "--lr", "0.1"], "torchrun")
    assert written == flagged
    assert written.program == ("train.py", "--lr", "0.1") and written.prefix == ("torchrun",)


def test_the_users_torchrun_options_are_kept_and_a_python_prefix_is_its_interpreter():
    spec = parse(["/v/bin/python", "-m", "torch.distributed.run", "--max-restarts=2", "--monitor-interval", "1",
                  "-m", "pkg.train", "--epochs", "3"])
    assert spec.prefix == ("/v/bin/python", "-m", "torch.distributed.run")
    assert spec.options == ("--max-restarts=2", "--monitor-interval", "1")
    assert spec.mode == "module" and spec.program == ("pkg.train", "--epochs", "3")
    flagged = parse(["/v/bin/python", "-m", "pkg.train"], "torchrun")
    assert flagged.prefix == ("/v/bin/python", "-m", "torch.distributed.run") and flagged.mode == "module"


def test_options_the_tool_sets_per_node_are_refused_with_the_reason():
    with pytest.raises(UsageError, match="leave out --nnodes, --node-rank"):
        parse(["torchrun", "--nnodes", "2", "--node-rank=0", "train.py"])
    with pytest.raises(UsageError, match="--num_machines"):
        parse(["accelerate", "launch", "--num_machines", "4", "train.py"])
    with pytest.raises(UsageError, match="no training script"):
        parse(["torchrun", "--max-restarts", "3"])
    with pytest.raises(UsageError, match="starts torchrun, but --launcher is deepspeed"):
        parse(["torchrun", "train.py"], "deepspeed")
    with pytest.raises(UsageError, match="use one of"):
        parse(["train.py"], "slurm")


def test_nproc_per_node_given_to_torchrun_becomes_the_jobs_per_node():
    plan = plan_job(cluster(), cluster().workers, MpiOptions(["torchrun", "--nproc-per-node", "1", "t.py"]), "j1")
    assert plan.np == 3 and [c for _, c in plan.layout] == [1, 1, 1]
    with pytest.raises(UsageError, match="disagree"):
        plan_job(cluster(), cluster().workers, MpiOptions(["torchrun", "--nproc_per_node=1", "t.py"], per_node=2), "j1")


def test_each_nodes_torchrun_line_static_rendezvous_at_the_leader():
    rdzv = Rendezvous("10.0.0.1", "j1", 6, 3)
    argv = node_argv(parse(["torchrun", "--max-restarts", "1", "t.py", "--lr", "1"]), NodeShare(2, 2, 4), rdzv)
    assert argv == ["torchrun", "--nnodes", "3", "--nproc-per-node", "2", "--node-rank", "2", "--master-addr",
                    "10.0.0.1", "--master-port", "{port}", "--max-restarts", "1", "{agent}", "--lr", "1"]
    c10d = node_argv(parse(["torchrun", "--rdzv-backend", "c10d", "t.py"]), NodeShare(0, 2, 0), rdzv)
    assert c10d[c10d.index("--rdzv-endpoint") + 1] == "10.0.0.1:{port}" and "--master-addr" not in c10d
    assert c10d[c10d.index("--rdzv-id") + 1] == "j1"


def test_accelerate_and_deepspeed_lines():
    rdzv = Rendezvous("10.0.0.1", "j1", 4, 2)
    spec = parse(["accelerate", "launch", "--config_file", "c.yaml", "--cpu", "t.py"])
    acc = node_argv(spec, NodeShare(1, 2, 2), rdzv)
    assert acc[:2] == ["accelerate", "launch"] and "--multi_gpu" in acc and "--cpu" not in acc
    assert acc[acc.index("--num_processes") + 1] == "4" and acc[acc.index("--machine_rank") + 1] == "1"
    assert acc[acc.index("--config_file") + 1] == "c.yaml"
    assert launchers.wants_cpu(parse(["accelerate", "launch", "--cpu", "t.py"]))
    fsdp = node_argv(parse(["accelerate", "launch", "--use_fsdp", "t.py"]), NodeShare(0, 2, 0), rdzv)
    assert "--multi_gpu" not in fsdp
    ds = node_argv(parse(["deepspeed", "t.py", "--deepspeed_config", "ds.json"]), NodeShare(1, 2, 2), rdzv)
    assert ds[:2] == ["deepspeed", "--hostfile"] and "--no_ssh" in ds
    assert ds[ds.index("--node_rank") + 1] == "1" and ds[ds.index("--num_gpus") + 1] == "2"
    assert ds[-3:] == ["{agent}", "--deepspeed_config", "ds.json"]


def test_a_node_launcher_job_is_one_agent_per_node_servers_excluded():
    c = cluster(3, 2, servers=1)
    plan = plan_job(c, c.workers, MpiOptions(["torchrun", "t.py"]), "j1")
    argv = plan.argv
    assert argv[0] == "$HOME/.clustertool/jobs/j1/fan.py" and "mpirun" not in argv
    assert argv[argv.index("-H") + 1] == "10.0.0.1,10.0.0.2,10.0.0.3" and plan.np == 6  # the leader first
    assert plan.hostfile == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n10.0.0.3 slots=1\n"
    exported = [argv[i + 1] for i, w in enumerate(argv) if w == "-x"]
    assert "CLUSTERTOOL_JOB=j1" in exported and "MASTER_ADDR=10.0.0.1" in exported
    assert "--output-filename" not in argv
    agent = plan.agent_plan()
    assert [(s["nprocs"], s["first_rank"]) for s in agent["nodes"]] == [(2, 0), (2, 2), (2, 4)]
    assert agent["world_size"] == 6 and agent["program"] == {"mode": "python", "target": "t.py"}
    assert [n.name for n, _ in plan.node_commands()] == ["node-1", "node-2", "node-3"]


@pytest.mark.parametrize("command,tail", [
    (["torchrun", "t.py", "--lr", "1"], ["--master-port", "PORT", "t.py", "--lr", "1"]),
    (["torchrun", "-m", "pkg.train", "--lr", "1"], ["--master-port", "PORT", "-m", "pkg.train", "--lr", "1"]),
    (["deepspeed", "t.py"], ["--num_gpus", "2", "t.py"]),
])
def test_a_dry_run_shows_the_users_script_where_the_agent_stands(command, tail):
    c = cluster(2, 2)
    plan = plan_job(c, c.workers, MpiOptions(command), "j1")
    for _, argv in plan.shown_node_commands():
        assert argv[-len(tail):] == tail and not any("{" in w for w in argv), argv


def test_process_with_np_runs_only_on_the_nodes_that_get_ranks():
    plan = plan_job(cluster(), cluster().workers, MpiOptions(["python", "t.py"], np=3, launcher="process"), "j1")
    agent = plan.agent_plan()
    assert [(s["nprocs"], s["first_rank"]) for s in agent["nodes"]] == [(2, 0), (1, 2)]
    assert agent["program"] == {"mode": "exec", "argv": ["python", "t.py"]}
    assert plan.argv[plan.argv.index("-H") + 1] == "10.0.0.1,10.0.0.2"  # one agent on each of the two nodes


def test_accelerate_needs_the_same_number_of_processes_on_every_node():
    with pytest.raises(UsageError, match="same number of processes on every node"):
        plan_job(cluster(), cluster().workers, MpiOptions(["accelerate", "launch", "t.py"], np=3), "j1")
    plan = plan_job(cluster(), cluster().workers, MpiOptions(["deepspeed", "t.py"], per_node=1), "j1")
    assert plan.agent_plan()["hostfile"] == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n10.0.0.3 slots=1\n"


def test_mpirun_jobs_keep_their_rank_wrapper():
    plan = plan_job(cluster(), cluster().workers, MpiOptions(["python", "t.py"]), "j1")
    assert plan.launcher == "mpirun" and "ct-rank" in plan.argv and "--output-filename" in plan.argv


def test_a_node_agent_that_starts_after_kill_marked_its_node_starts_nothing(tmp_path):
    """Like the rank wrapper: `kill` marks the job's folder on each node before it looks for
    processes, so an agent mpirun starts late exits at once instead of starting the ranks."""
    import shutil
    import subprocess
    import sys

    from clustertool.nodeprogs import jobagent

    shutil.copy(jobagent.__file__, tmp_path / "jobagent.py")
    (tmp_path / "killed").touch()  # no agent.json: reading the plan would fail
    ran = subprocess.run([sys.executable, str(tmp_path / "jobagent.py")], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_RANK": "1"})
    assert ran.returncode == 143 and ran.stderr == ""
