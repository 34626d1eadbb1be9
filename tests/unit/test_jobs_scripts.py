"""Job node programs run against this machine with a scratch HOME; records and state logic."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import JobRecord
from clustertool.jobs import kill, records, scripts
from clustertool.jobs.manage import reboot_line, remote_path_sh, s3_upload_line

pytestmark = pytest.mark.unit


def sh(script, home, **kw):
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(["sh", "-s"], input=script, text=True, capture_output=True, env=env, **kw)


def new_id():
    return f"junit-{uuid.uuid4().hex[:8]}"


def wait_for(path, timeout=10):
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_detached_launch_without_tmux_records_log_pid_and_exit_code(tmp_path):
    job_id = new_id()
    launch = scripts.launch_script(job_id, ["sh", "-c", "echo 'out line'; echo 'err line' >&2; exit 4"], None)
    record = json.dumps({"id": "x", "detached": "pending"})
    out = sh(scripts.install_and_start_script(job_id, launch, "h slots=1\n", record, prefer_tmux=False),
             tmp_path, check=True).stdout
    assert "detached=setsid" in out
    d = tmp_path / ".clustertool/jobs" / job_id
    assert wait_for(d / "exit")
    assert (d / "exit").read_text().strip() == "4"
    assert (d / "log").read_text().splitlines() == ["out line", "err line"]
    assert (d / "hostfile").read_text() == "h slots=1\n" and len((d / "launch.pid").read_text().split()) == 4
    status = records.parse_status(sh(scripts.status_script(), tmp_path, check=True).stdout)
    code, alive, killed, launched, ended, record = status[job_id]
    assert (code, alive, killed, launched, record) == ("4", False, False, True, {"id": "x", "detached": "setsid"})
    assert ended > 0


def test_launch_into_a_missing_workdir_fails_with_exit_1(tmp_path):
    job_id = new_id()
    launch = scripts.launch_script(job_id, ["true"], str(tmp_path / "nope"))
    sh(scripts.install_and_start_script(job_id, launch, "", "{}", prefer_tmux=False), tmp_path, check=True)
    d = tmp_path / ".clustertool/jobs" / job_id
    assert wait_for(d / "exit") and (d / "exit").read_text().strip() == "1"
    assert "cannot cd" in (d / "log").read_text()


def test_kill_script_stops_marked_processes_and_reports_nothing_left(tmp_path):
    job_id = new_id()
    env = dict(os.environ, CLUSTERTOOL_JOB=job_id)
    procs = [subprocess.Popen(["sleep", "300"], env=env, start_new_session=True) for _ in range(2)]
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        listed = sh(scripts.list_script(job_id), tmp_path, check=True).stdout
        assert sorted(int(line.split()[0]) for line in listed.splitlines()) == sorted(p.pid for p in procs)
        out = sh(scripts.kill_script(job_id, "TERM", 2), tmp_path, check=True).stdout
        result = kill.parse_kill_output("here", out)
        assert sorted(result.signaled) == sorted(p.pid for p in procs)
        assert result.remaining == [] and result.forced == [] and result.clean
        assert all(p.wait(timeout=5) == -15 for p in procs)
        assert bystander.poll() is None  # not the job's: untouched
    finally:
        for p in procs + [bystander]:
            p.kill()
            p.wait()


def test_kill_script_forces_kill_after_the_grace_period(tmp_path):
    job_id = new_id()
    env = dict(os.environ, CLUSTERTOOL_JOB=job_id)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], env=env,
                                start_new_session=True)
    try:
        time.sleep(0.2)
        out = sh(scripts.kill_script(job_id, "TERM", 0.5), tmp_path, check=True).stdout
        result = kill.parse_kill_output("here", out)
        # TERM ignored, KILL after the grace: the script says it forced it, and KILL is what ended it (the
        # seconds a loaded box takes are not the behaviour: a wall-clock bound failed at load 20)
        assert stubborn.pid in result.forced and result.remaining == []
        assert stubborn.wait(timeout=30) == -9
    finally:
        stubborn.kill()
        stubborn.wait()


def test_kill_script_kills_recorded_sessions_of_this_host(tmp_path):
    job_id = new_id()
    # a process of the job that dropped the marker, but whose session a rank wrapper recorded
    child = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"]}, start_new_session=True)
    try:
        d = tmp_path / ".clustertool/jobs" / job_id / "ranks"
        d.mkdir(parents=True)
        host = os.uname().nodename
        (d / f"{host}.0").write_text(f"{child.pid} 1 {child.pid} {child.pid}\n")
        (d / "other-host.1").write_text(f"{os.getpid()} 1 {os.getpgid(0)} {os.getsid(0)}\n")  # never us
        out = sh(scripts.kill_script(job_id, "KILL", 0), tmp_path, check=True).stdout
        assert kill.parse_kill_output("here", out).signaled == [child.pid]
        assert child.wait(timeout=5) == -9
    finally:
        child.kill()
        child.wait()


def test_kill_output_parsing_with_gpu_memory():
    text = "signaled 1 2 \nforced 2\nremaining 7:python3\ngpu checked 7:1024 \n"
    nk = kill.parse_kill_output("node-1", text)
    assert (nk.signaled, nk.forced, nk.remaining, nk.gpu) == ([1, 2], [2], ["7:python3"], "held: 7:1024")
    assert not nk.clean
    assert kill.parse_kill_output("n", "gpu checked \n").gpu == "freed"
    assert kill.parse_kill_output("n", "gpu none\n").gpu == "no nvidia-smi"


def test_unknown_signal_is_refused():
    with pytest.raises(UsageError, match="--signal"):
        scripts.kill_script("j1-a", "BOGUS")


def test_clean_keeps_running_jobs(tmp_path):
    base = tmp_path / ".clustertool/jobs"
    for j in ("j1-old", "j2-run"):
        (base / j).mkdir(parents=True)
        (base / j / "log").write_text("x")
    out = sh(scripts.clean_script(["j2-run"], logs=True, records=False), tmp_path, check=True).stdout
    assert "removed j1-old" in out and "kept j2-run" in out
    assert (base / "j1-old").is_dir() and not (base / "j1-old/log").exists() and (base / "j2-run/log").exists()
    sh(scripts.clean_script(["j2-run"], logs=False, records=True), tmp_path, check=True)
    assert sorted(p.name for p in base.iterdir()) == ["j2-run"]


@pytest.mark.parametrize("bad", ["J1", "a b", "../x", "x;rm", ""])
def test_job_ids_are_checked_before_reaching_a_shell(bad):
    with pytest.raises(UsageError):
        scripts.job_dir_sh(bad)


@pytest.mark.parametrize("code,alive,killed,launched,age,expected", [
    ("0", False, False, True, 100, ("succeeded", 0)),
    ("3", False, False, True, 100, ("failed", 3)),
    ("143", False, True, True, 100, ("killed", 143)),
    ("-", True, False, True, 100, ("running", None)),
    ("-", False, True, True, 100, ("killed", None)),
    ("-", False, False, False, 5, ("running", None)),
    ("-", False, False, False, 100, ("lost", None)),
    ("-", False, False, True, 100, ("lost", None)),
])
def test_state_from_the_leaders_job_directory(code, alive, killed, launched, age, expected):
    assert records.derive_state(code, alive, killed, launched, started=1000.0, now=1000.0 + age) == expected


def test_parse_status_lines():
    b64 = base64.b64encode(json.dumps({"id": "j1-a", "cluster": "c", "command": ["x"]}).encode()).decode()
    out = records.parse_status(f"J j1-a 0 0 0 1 1700000000 {b64}\ngarbage\nJ j2-b - 1 0 1 0 !!!\n")
    assert out["j1-a"] == ("0", False, False, True, 1700000000.0, {"id": "j1-a", "cluster": "c", "command": ["x"]})
    assert out["j2-b"] == ("-", True, False, True, None, None)


def test_resolve_by_id_prefix_and_name():
    jobs = [JobRecord("j1122-aaaa11", "c", ["x"], name="train", started=1),
            JobRecord("j1122-bbbb22", "c", ["x"], started=2),
            JobRecord("j1122-aaab33", "c", ["x"], name="train", started=3)]
    assert records.resolve(jobs, "j1122-bbbb22").id == "j1122-bbbb22"
    assert records.resolve(jobs, "j1122-b").id == "j1122-bbbb22"
    assert records.resolve(jobs, "train").id == "j1122-aaab33"
    with pytest.raises(UsageError, match="ambiguous"):
        records.resolve(jobs, "j1122-aaa")
    with pytest.raises(UsageError, match="no job 'zzz'"):
        records.resolve(jobs, "zzz")


def test_kill_refuses_finished_jobs_and_picks_the_single_running_one():
    done = JobRecord("j1-a", "c", ["x"], state="failed", exit_code=2)
    run = JobRecord("j1-b", "c", ["x"], state="running")
    with pytest.raises(UsageError, match="job j1-a is not running: it failed with exit code 2"):
        kill.pick_running([done, run], "j1-a")
    assert kill.pick_running([done, run], None).id == "j1-b"
    with pytest.raises(UsageError, match="no running job"):
        kill.pick_running([done], None)
    with pytest.raises(UsageError, match="2 jobs are running"):
        kill.pick_running([run, JobRecord("j1-c", "c", ["y"])], None)


def test_fetch_and_reboot_lines_quote_paths():
    assert remote_path_sh(None, "out dir") == "\"$HOME\"/'out dir'"
    assert remote_path_sh("/data/run 1", "o") == "'/data/run 1'/o"
    assert remote_path_sh(None, "/abs/x;y") == "'/abs/x;y'"
    assert remote_path_sh(None, "~/res") == '"$HOME"/res'
    assert "aws s3 sync '/a b' s3://bucket/p" in s3_upload_line("'/a b'", "s3://bucket/p")
    with pytest.raises(UsageError):
        s3_upload_line("x", "http://nope")
    assert "sudo -n reboot" in reboot_line("ubuntu") and "sudo" not in reboot_line("root")


def test_kill_reports_gpu_memory_still_held_by_a_killed_pid(tmp_path):
    """nvidia-smi here is a stand-in script (no GPU on this machine) that lists the killed pid."""
    job_id = new_id()
    victim = subprocess.Popen(["sleep", "300"], env=dict(os.environ, CLUSTERTOOL_JOB=job_id), start_new_session=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho '{victim.pid}, 2048'\necho '99999999, 10'\n")
    fake.chmod(0o755)
    try:
        env = dict(os.environ, HOME=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
        out = subprocess.run(["sh", "-s"], input=scripts.kill_script(job_id, "TERM", 1), text=True,
                             capture_output=True, env=env, check=True).stdout
        result = kill.parse_kill_output("here", out)
        assert result.gpu == f"held: {victim.pid}:2048" and not result.clean
    finally:
        victim.kill()
        victim.wait()


def test_a_rank_that_starts_after_kill_marked_its_node_never_runs(tmp_path):
    """The race CI hit: `kill` right after `run`, while mpirun was still reaching a member. That
    node had no process of the job yet, so kill found none; the rank started a moment later and
    was left running. Now kill marks the node first and the rank wrapper stops at the mark."""
    from clustertool.jobs.mpirun import RANK_WRAPPER

    job_id = new_id()
    out = sh(scripts.kill_script(job_id, "TERM", 0), tmp_path, check=True).stdout
    assert "signaled \n" in out and (tmp_path / ".clustertool/jobs" / job_id / "killed").exists()
    proof = tmp_path / "ran"
    env = {"HOME": str(tmp_path), "CLUSTERTOOL_JOB": job_id, "OMPI_COMM_WORLD_RANK": "0", "PATH": "/usr/bin:/bin"}
    late = subprocess.run(["sh", "-c", RANK_WRAPPER, "ct-rank", "touch", str(proof)], env=env)
    assert late.returncode == 143 and not proof.exists()
    other = dict(env, CLUSTERTOOL_JOB=new_id())  # another job on the same node still runs
    assert subprocess.run(["sh", "-c", RANK_WRAPPER, "ct-rank", "touch", str(proof)], env=other).returncode == 0
    assert proof.exists()
