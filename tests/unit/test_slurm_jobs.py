"""Jobs through Slurm, without Slurm: the batch script (valid shell; the step's words quoted but for the
allocation's own variables; the failing rank's code kept, not srun's 143; --restarts as a requeue), where a job
may run (cordoned nodes excluded, --np as a node count), sbatch's argv, the leader's waiter following Slurm's
states (a requeue by the script or by a node's death, a job that ended between two looks), and the record
taking what the waiter wrote (a queued job is pending, Slurm's node names become the record's)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, JobRecord, Node
from clustertool.jobs import records, slurmbatch, slurmrun
from clustertool.jobs.jobrequests import RunRequest
from clustertool.nodeprogs import DIR
from clustertool.slurm.layout import private_layout
from clustertool.slurm.slurminfo import SlurmInfo

pytestmark = pytest.mark.unit


def cluster(n: int = 4, slots: int = 2, cordoned: tuple[str, ...] = ()) -> ClusterRecord:
    nodes = [Node(f"node-{i}", i, f"10.213.7.{i}", role="leader" if i == 1 else "member", slots=slots,
                  cordon={"reason": "bad"} if f"node-{i}" in cordoned else None) for i in range(1, n + 1)]
    return ClusterRecord("team", "local", nodes=nodes)


def info(record: ClusterRecord, **kw) -> SlurmInfo:
    return SlurmInfo(private_layout(), "node-1", tuple(n.name for n in record.nodes), partition="workers",
                     release="22.05.8", gpus=2, **kw)


def job(**kw) -> slurmbatch.BatchJob:
    values = dict(job_id="j1128-abc123", job_dir="/root/.clustertool/jobs/j1128-abc123",
                  step=["mpirun", "-np", "4", "--output-filename", f"{slurmbatch.OUT}:nocopy", "-x", "MASTER_ADDR",
                        "python3", "it's.py"],
                  node_launcher=False, addresses={"node-1": "10.213.7.1", "node-2": "10.213.7.2"},
                  env={"NCCL_DEBUG": "INFO"}, passed=["WANDB_KEY"], output_dir="/root/.clustertool/jobs/x/out")
    values.update(kw)
    return slurmbatch.BatchJob(**values)


def test_the_batch_script_is_valid_shell_and_quotes_everything_but_the_allocations_variables(tmp_path):
    text = slurmbatch.batch_script(job())
    assert """--output-filename "$CT_OUT":nocopy""" in text and "'it'\"'\"'s.py'" in text
    assert "export NCCL_DEBUG=INFO" in text and "export WANDB_KEY" in text
    assert "node-1) echo 10.213.7.1 ;;" in text
    script = tmp_path / "batch.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck"):
        found = subprocess.run(["shellcheck", "-s", "sh", "-e", "SC2016", str(script)], capture_output=True, text=True)
        assert found.returncode == 0, found.stdout


def _run_script(tmp_path, text: str, srun_out: str, code: int, restart: int = 0) -> subprocess.CompletedProcess:
    """The batch script with stand-ins for srun, mpirun and scontrol (Slurm is not needed to run it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$*" >> "$LOG"\n'
                                      '[ "$1" = show ] && [ "$2" = hostnames ] && printf "node-1\\nnode-2\\n"\n'
                                      '[ "$1" = -o ] && echo "JobId=5 Comment=$COMMENT"\nexit 0\n')
    (bin_dir / "mpirun").write_text(f"#!/bin/sh\nprintf %s {shlex.quote(srun_out)}\nexit {code}\n")
    for tool in ("scontrol", "mpirun"):
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "batch.sh"
    script.write_text(text.replace("/root/.clustertool/jobs/j1128-abc123", str(tmp_path / "job")))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "5",
           "SLURM_JOB_NODELIST": "node-[1-2]", "SLURM_RESTART_COUNT": str(restart), "LOG": str(tmp_path / "log"),
           "COMMENT": "ct:3" if restart else "(null)"}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=30)


def test_the_jobs_exit_code_is_the_first_failing_ranks_not_the_143_of_the_tasks_srun_stopped(tmp_path):
    said = ("srun: error: node-2: task 1: Exited with exit code 7\n"
            "srun: error: node-1: task 0: Exited with exit code 143\n")
    done = _run_script(tmp_path, slurmbatch.batch_script(job()), said, 143)
    said = (tmp_path / "job" / "batch.out").read_text()  # the script keeps its own output in the job's folder
    assert done.returncode == 7, said
    assert "master 10.213.7.1" in said and "task 1: Exited with exit code 7" in said


def test_a_failed_attempt_requeues_the_job_while_restarts_are_left_and_keeps_its_code(tmp_path):
    text = slurmbatch.batch_script(job(restarts=2, restart_codes=(3, 9)))
    first = _run_script(tmp_path, text, "", 3)
    log = (tmp_path / "log").read_text()
    assert first.returncode == 3 and "update JobId=5 Comment=ct:3" in log and "requeue 5" in log
    (tmp_path / "log").unlink()
    other = _run_script(tmp_path, text, "", 4)  # not a code --restart-on-exit-codes names: no requeue
    assert other.returncode == 4 and "requeue" not in (tmp_path / "log").read_text()


def test_no_requeue_once_the_restarts_are_used_or_the_job_was_killed(tmp_path):
    text = slurmbatch.batch_script(job(restarts=1))
    used = _run_script(tmp_path, text, "", 3, restart=1)  # the comment says one attempt failed already
    assert used.returncode == 3 and "requeue" not in (tmp_path / "log").read_text()
    (tmp_path / "log").unlink()
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / "killed").touch()
    killed = _run_script(tmp_path, text, "", 3)
    assert killed.returncode == 3 and "requeue" not in (tmp_path / "log").read_text()


def test_a_node_launchers_step_starts_one_agent_per_node_after_putting_its_files_there():
    text = slurmbatch.batch_script(job(node_launcher=True, step=slurmbatch.agent_step("/root/j"),
                                       agent_files={"jobagent.py": "print(1)\n", "agent.json": "{}"}))
    lines = [ln for ln in text.splitlines() if "srun " in ln]  # the files, the agents, the cleanup after them
    assert len(lines) == 3 and all('--ntasks="$SLURM_NNODES" --ntasks-per-node=1' in ln for ln in lines)
    assert "python3 /root/j/jobagent.py" in lines[1]
    assert lines[1].startswith("{ env CLUSTERTOOL_JOB=j1128-abc123 CLUSTERTOOL_SLURM_STEP=j1128-abc123 srun")
    assert "export CLUSTERTOOL_JOB" not in text  # only the step carries the job's marker (the cleanup finds it)


def test_what_a_step_leaves_behind_is_stopped_on_every_node_by_the_steps_own_marker(tmp_path):
    text = slurmbatch.batch_script(job())
    assert 'srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c ' \
           '"$cleanup" >> "$d/cleanup.out" 2>&1 || true' in text
    assert text.index('sh -c "$cleanup"') < text.index('exit "$code"')
    assert "export CLUSTERTOOL_SLURM_STEP" not in text  # this script never carries the marker itself
    # the program: a marked process (with a child that ignores TERM) is stopped, an unmarked one is not
    marked = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"],
                              env={"PATH": "/usr/bin:/bin", slurmbatch.STEP_ENV: "j1128-abc123"})
    other = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", slurmbatch.STEP_ENV: "j1128-zzz"})
    try:
        time.sleep(0.3)
        done = subprocess.run(["sh", "-c", slurmbatch.cleanup_program("j1128-abc123", tenths=5)],
                              capture_output=True, text=True, timeout=30)
        assert "stopped 2 process(es) the step left" in done.stdout, done.stdout + done.stderr
        assert marked.wait(timeout=10) != 0 and other.poll() is None
    finally:
        other.kill()
        marked.kill()
        other.wait()


def test_slurm_picks_the_nodes_among_those_not_cordoned_and_np_becomes_a_node_count():
    record = cluster(4, 2, cordoned=("node-3",))
    where = slurmrun.placement(record, info(record), RunRequest.of("python3 t.py", np=3), None)
    assert (where.count, where.per_node, where.exclude, where.nodelist) == (2, 2, ("node-3",), ())
    assert [n.name for n in where.model] == ["node-1", "node-2"]
    every = slurmrun.placement(record, info(record), RunRequest.of("python3 t.py"), None)
    assert every.count == 3  # every node not cordoned
    with pytest.raises(UsageError, match=r"--np 8 needs 4 node\(s\) of 2 rank\(s\), and 3 can run jobs \(node-3"):
        slurmrun.placement(record, info(record), RunRequest.of("python3 t.py", np=8), None)


def test_nodes_named_by_the_user_are_slurms_nodelist_and_must_be_slurm_nodes():
    record = cluster(3)
    found = SlurmInfo(private_layout(), "node-1", ("node-2", "node-3"), leader_compute=False)
    named = slurmrun.placement(record, found, RunRequest.of("x"), [record.node("node-2"), record.node("node-3")])
    assert named.nodelist == ("node-2", "node-3") and named.exclude == ()
    with pytest.raises(UsageError, match="node-1: not a Slurm compute node"):
        slurmrun.placement(record, found, RunRequest.of("x"), [record.node("node-1")])


def test_sbatch_takes_whole_nodes_every_gpu_requeues_and_waits_for_after():
    record = cluster(4, 2, cordoned=("node-4",))
    found = info(record)
    request = RunRequest.of("python3 t.py", np=4, launcher="process")
    where = slurmrun.placement(record, found, request, None)
    plan = slurmrun.make_plan(record, where, request, "j1128-abc123", "/root")
    spec = slurmrun.sbatch_spec(found, where, plan, "/root/.clustertool/jobs/j1128-abc123", "41", "/root")
    from clustertool.slurm.slurmcmd import sbatch_argv

    argv = sbatch_argv(spec)
    for word in ("--nodes=2", "--ntasks-per-node=2", "--exclude=node-4", "--exclusive", "--requeue",
                 "--gres=gpu:2", "--dependency=afterany:41", "--partition=workers", "--output=/dev/null"):
        assert word in argv, (word, argv)
    assert argv[-1] == "/root/.clustertool/jobs/j1128-abc123/batch.sh"


def test_the_agents_plan_leaves_the_masters_address_to_the_node_and_mpirun_gets_no_host_list():
    record = cluster(4, 2)
    found = info(record)
    for launcher in ("torchrun", "mpirun"):
        request = RunRequest.of(["torchrun", "t.py"] if launcher == "torchrun" else "python3 t.py", np=4)
        where = slurmrun.placement(record, found, request, None)
        plan = slurmrun.make_plan(record, where, request, "j1128-abc123", "/root")
        batch = slurmrun.batch_job(record, found, plan, request, "/root", 29999)
        if launcher == "torchrun":
            agent = json.loads(batch.agent_files["agent.json"])
            assert all("{master_addr}" in share["argv"] for share in agent["nodes"])
            assert "10.213.7.1" not in batch.agent_files["agent.json"]
            assert batch.env["CLUSTERTOOL_JOB"] == "j1128-abc123" and "MASTER_ADDR" in batch.passed
        else:
            assert "-H" not in batch.step and "--hostfile" not in batch.step
            assert batch.step[batch.step.index("-np") + 1] == "4"
            assert "MASTER_ADDR" in batch.step and f"{slurmbatch.OUT}:nocopy" in batch.step


def test_what_slurm_does_not_run_yet_is_refused_before_anything_starts():
    for flag, request in (("--hang-timeout", RunRequest.of("x", hang_timeout=60)),
                          ("--plugin", RunRequest.of("x", plugin=True))):
        with pytest.raises(UsageError, match=flag):
            slurmrun._refuse(request)


# ---- the leader's waiter (nodeprogs/slurmjob.py), its scontrol scripted ------------------------------------

def waiter_module(tmp_path, answers: list[str]):
    spec = importlib.util.spec_from_file_location("slurmjob_under_test", DIR / "slurmjob.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OPTS.update({"job_dir": str(tmp_path), "slurm_id": "12", "batch_out": str(tmp_path / "batch.out"),
                        "poll": 0, "conf": None, "jobcomp": None})
    calls = []

    def slurm(argv, timeout=30):
        calls.append(argv)
        if argv[1] == "show" and argv[2] == "hostnames":
            return 0, "\n".join({"node-[1-2]": ["node-1", "node-2"], "node-[2-3]": ["node-2", "node-3"]}[argv[3]])
        if argv[:3] == ["scontrol", "-o", "show"]:
            return 0, answers.pop(0) if len(answers) > 1 else answers[0]
        return 0, ""

    module.slurm = slurm
    return module, calls


def line(state: str, reason: str = "None", restarts: int = 0, nodes: str = "(null)", code: str = "0:0",
         comment: str = "(null)") -> str:
    return (f"JobId=12 JobName=j1 UserId=alice(1000) JobState={state} Reason={reason} Restarts={restarts} "
            f"ExitCode={code} NodeList={nodes} BatchHost=node-1 Comment={comment}\n")


def test_the_waiter_follows_a_queued_job_to_its_end_and_releases_a_requeue_at_once(tmp_path, capsys):
    module, calls = waiter_module(tmp_path, [
        line("PENDING", "Resources"), line("RUNNING", nodes="node-[1-2]"),
        line("PENDING", "BeginTime", restarts=1, comment="ct:3"),
        line("RUNNING", restarts=1, nodes="node-[2-3]", comment="ct:3"),
        line("COMPLETED", restarts=1, nodes="node-[2-3]", comment="ct:3")])
    assert module.Waiter().run() == 0
    doc = json.loads((tmp_path / "slurm.json").read_text())
    assert doc["state"] == "COMPLETED" and doc["user"] == "alice" and doc["nodes"] == ["node-1", "node-2", "node-3"]
    assert [(a["attempt"], a["code"], a["cause"]) for a in doc["attempts"]] == [(1, 3, "exit code 3"), (2, 0, None)]
    assert ["scontrol", "update", "JobId=12", "StartTime=now"] in calls  # not Slurm's two minutes
    out = capsys.readouterr().out
    assert "pending (Resources)" in out and "attempt 1 failed with exit code 3: requeued" in out


def test_a_run_that_failed_and_was_requeued_between_two_looks_is_still_an_attempt_with_its_code(tmp_path, capsys):
    for first in ([line("PENDING", "BeginTime", restarts=1, comment="ct:3")], []):  # its requeue seen, or not even
        module, _ = waiter_module(tmp_path, [line("PENDING", "Resources"), *first,
                                             line("RUNNING", restarts=1, nodes="node-[2-3]", comment="ct:3"),
                                             line("COMPLETED", restarts=1, nodes="node-[2-3]", comment="ct:3")])
        assert module.Waiter().run() == 0
        doc = json.loads((tmp_path / "slurm.json").read_text())
        assert [(a["attempt"], a["code"], a["cause"]) for a in doc["attempts"]] == [(1, 3, "exit code 3"),
                                                                                     (2, 0, None)]
        assert "attempt 1 failed with exit code 3: requeued" in capsys.readouterr().out


def test_a_node_death_is_a_requeue_without_a_code_and_a_short_job_seen_only_ended_still_has_its_nodes(tmp_path):
    module, _ = waiter_module(tmp_path, [line("RUNNING", nodes="node-[1-2]"),
                                         line("COMPLETING", restarts=1, nodes="node-2"),
                                         line("PENDING", "BeginTime", restarts=1),
                                         line("FAILED", restarts=1, nodes="node-[2-3]", code="7:0")])
    assert module.Waiter().run() == 7
    doc = json.loads((tmp_path / "slurm.json").read_text())
    assert [(a["code"], a["cause"]) for a in doc["attempts"]] == [(None, "node failure"), (7, "exit code 7")]
    module2, _ = waiter_module(tmp_path, [line("CANCELLED", nodes="node-[1-2]", code="0:15")])
    assert module2.Waiter().run() == 143


def test_the_record_takes_the_waiters_view_a_queued_job_is_pending_with_our_node_names():
    record = cluster(3)
    found = SlurmInfo(private_layout(), "node-1", ("node-2", "node-3"), names={"node-2": "gpu-a", "node-3": "gpu-b"})
    job = JobRecord("j1", "team", ["x"], state="running", slurm={"id": "12"})
    records.take_slurm(job, {}, found)
    assert job.state == "pending"  # queued: the waiter has not written yet
    records.take_slurm(job, {"state": "RUNNING", "nodes": ["gpu-b"], "attempts": [{"attempt": 1, "start": 1.0}]},
                       found)
    assert (job.state, job.nodes, job.slurm["id"]) == ("running", ["node-3"], "12")
    assert job.attempts == [{"attempt": 1, "start": 1.0, "end": None, "code": None, "cause": None}]
    assert record.node("node-3").name in job.nodes


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
