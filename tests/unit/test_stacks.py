"""`stacks`: py-spy's answers (recorded from the real py-spy 0.4.3, tests/unit/data/pyspy-0.4.3-recorded)
become one stack per rank, ranks with the same stack fold into one line, the user's frames show
over library internals, and the /proc fallback says which method it used.  The node program also
runs here for real against a sleeping python (no ssh); the orchestration over a scripted transport
names a node that does not answer.  A real job on a local cluster: tests/local/test_stacks.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.core.model import JobRecord
from clustertool.jobs import records, stacks
from clustertool.jobs.jobrequests import StacksRequest
from clustertool.nodeprogs.stacks import error_line, proc_info, syscall_name, threads_from_py_spy
from tests.fakes.cluster import saved_job
from tests.fakes.transport import Reply, ScriptedTransport

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data" / "pyspy-0.4.3-recorded"
JOB = "j0101-abc123"


def recorded(name: str) -> list[dict]:
    return threads_from_py_spy(json.loads((DATA / name).read_text()))


def entry(rank: int, threads: list[dict], pid: int | None = None) -> dict:
    """One rank as the node program reports it, with py-spy's threads."""
    pid = pid if pid is not None else threads[-1]["id"]
    return {"rank": rank, "pid": pid, "alive": True, "method": "py-spy", "py_spy": "/x/py-spy", "threads": threads,
            "proc": {"state": "S"}, "note": None}


def main_pid(name: str) -> int:
    return next(t["os_thread_id"] for t in json.loads((DATA / name).read_text()) if t["thread_name"] == "MainThread")


def test_fold_ranks_writes_runs():
    assert stacks.fold_ranks([8, 0, 1, 2, 3, 4, 5, 6, 9, 10, 31, 12]) == "0-6,8-10,12,31"
    assert stacks.fold_ranks([4]) == "4" and stacks.fold_ranks([]) == ""


def test_the_main_thread_of_a_recorded_dump_renders_innermost_first():
    stack = stacks.rank_stack("node-1", entry(0, recorded("dump-sleep.json"), main_pid("dump-sleep.json")))
    assert stack.thread == "MainThread" and stack.method == "py-spy"
    assert [f.key for f in stack.frames] == [("stuck_here", "sleeper.py", 9), ("main", "sleeper.py", 26),
                                            ("<module>", "sleeper.py", 30)]
    assert stacks.describe(stack) == "stuck_here (sleeper.py:9) ← main (sleeper.py:26) ← sleeper.py:30"


def test_library_frames_show_as_the_innermost_name_then_an_ellipsis_before_the_users_frames():
    stack = stacks.rank_stack("node-1", entry(0, recorded("dump-event.json"), main_pid("dump-event.json")))
    assert [f.library for f in stack.frames] == [True, True, False, False, False]   # threading.py: stdlib
    assert stacks.describe(stack) == ("Condition.wait ← … ← waiting (sleeper.py:13) ← main (sleeper.py:24) "
                                      "← sleeper.py:30")


def test_a_long_stack_is_cut_after_a_few_items():
    frames = [stacks.Frame(f"f{i}", "/home/u/train.py", i) for i in range(9)]
    assert stacks.describe_frames(frames) == ("f0 (train.py:0) ← f1 (train.py:1) ← f2 (train.py:2) ← f3 (train.py:3) "
                                          "← f4 (train.py:4) ← …")


def test_identical_stacks_fold_biggest_group_first_and_the_lonely_rank_last():
    waiting, stuck = recorded("dump-event.json"), recorded("dump-sleep.json")
    ranks = [stacks.rank_stack(f"node-{1 + r // 8}", entry(r, stuck if r == 7 else waiting, 1000 + r))
             for r in range(32)]
    groups = stacks.fold(ranks)
    assert [g.label for g in groups] == ["ranks 0-6,8-31 (node-[1-4])", "rank 7 (node-1)"]
    assert groups[0].summary.startswith("Condition.wait ← … ← waiting (sleeper.py:13)")
    assert groups[1].summary.startswith("stuck_here (sleeper.py:9)")


def test_a_working_thread_counts_over_an_idle_main_thread():
    threads = recorded("dump-sleep.json")
    for t in threads:
        t["active"] = t["name"] == "heartbeat"
    stack = stacks.rank_stack("node-1", entry(3, threads, main_pid("dump-sleep.json")))
    assert stack.thread == "heartbeat"
    assert stacks.describe(stack) == "[thread heartbeat] heartbeat (sleeper.py:18)"   # threading.py bootstrap left out


def test_the_flight_recorders_own_thread_never_counts_over_an_idle_main_thread():
    """The recorder's thread is busy only because `stacks` asked it to dump (seen on a loaded box: every rank
    showed it, none the collective it waited in)."""
    threads = recorded("dump-sleep.json")
    for t in threads:
        if t["name"] == "heartbeat":
            t["name"], t["active"] = "clustertool-flight-recorder", True
        else:
            t["active"] = False
    stack = stacks.rank_stack("node-1", entry(3, threads, main_pid("dump-sleep.json")))
    assert stack.thread == "MainThread"
    source = (Path(stacks.__file__).parent.parent / "nodeprogs" / "frhook.py").read_text()
    assert all(f'name="{name}"' in source for name in stacks.OWN_THREADS)  # the hook's thread, by its name


def test_what_py_spy_says_when_it_cannot_is_its_error_line_not_the_backtrace():
    assert (DATA / "dump-not-python.rc").read_text().strip() == "1"
    stderr = (DATA / "dump-not-python.stderr").read_text()
    assert error_line(stderr) == "Error: Failed to find python version from target process"


def test_proc_fallback_ranks_fold_on_state_and_call_not_on_pid_or_cpu_and_say_the_method():
    def fallback(rank, cpu):
        return {"rank": rank, "pid": 500 + rank, "alive": True, "method": "proc", "note": "py-spy not found",
                "proc": {"state": "S", "syscall": "futex", "wchan": "futex_wait_queue", "cpu_s": cpu,
                         "cmdline": "python train.py", "threads": {"S": 3}}}
    groups = stacks.fold([stacks.rank_stack("node-1", fallback(r, r * 1.5)) for r in range(3)])
    assert len(groups) == 1 and groups[0].label == "ranks 0-2 (node-1)"
    assert groups[0].summary == ("[/proc; py-spy not found] state S in futex (wchan futex_wait_queue), cpu 0-3s: "
                                 "python train.py")


def test_a_rank_whose_process_is_gone_is_its_own_group():
    gone = {"rank": 2, "pid": 9, "alive": False, "note": "process gone"}
    groups = stacks.fold([stacks.rank_stack("node-2", gone)])
    assert (groups[0].label, groups[0].summary) == ("rank 2 (node-2)", "not running (process gone)")


def test_syscall_numbers_are_named_per_architecture():
    assert syscall_name("202 0x7f 0x80 0x0", "x86_64") == "futex"
    assert syscall_name("98 0x1 0x2", "aarch64") == "futex"
    assert syscall_name("running", "x86_64") == "running"
    assert syscall_name("-1 0x7ffd 0x4011", "x86_64") == "none"
    assert syscall_name("999 0x0", "x86_64") == "syscall 999"


def test_proc_info_of_a_live_process():
    info = proc_info(os.getpid())
    assert info is not None and info["state"] in "RS" and info["cpu_s"] > 0
    assert "pytest" in info["cmdline"] or "python" in info["cmdline"]
    assert sum(info["threads"].values()) >= 1


SLEEPER = "import time\ndef stuck_here():\n    time.sleep(60)\nprint('ready', flush=True)\nstuck_here()\n"


@pytest.fixture
def sleeping_rank(tmp_path):
    """A python rank of job JOB sleeping in stuck_here(), with its record in a job folder under a home."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "CLUSTERTOOL_JOB": JOB},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    ranks = tmp_path / "home" / ".clustertool" / "jobs" / JOB / "ranks"
    ranks.mkdir(parents=True)
    host = os.uname().nodename
    (ranks / f"{host}.0").write_text(f"{proc.pid} 1 1 1\n")
    (ranks / f"{host}.1").write_text(f"{os.getpid()} 1 1 1\n")   # alive, but not the job's: a reused pid
    (ranks / "other-node.2").write_text(f"{proc.pid} 1 1 1\n")   # another node's record
    yield tmp_path / "home"
    proc.kill()
    proc.wait()


def run_program(home: Path, py_spy) -> dict:
    args = {"job": JOB, "jobs_dir": ".clustertool/jobs", "env": "CLUSTERTOOL_JOB", "py_spy": py_spy, "timeout": 10}
    out = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("stacks", args), capture_output=True,
                         env={**os.environ, "HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=60, check=True)
    return json.loads(out.stdout)


def test_the_node_program_with_py_spy_off_says_what_proc_sees_and_skips_other_processes(sleeping_rank):
    doc = run_program(sleeping_rank, False)
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(by_rank) == [0, 1]   # other-node.2 is not this node's
    assert by_rank[1]["alive"] is False and "another process" in by_rank[1]["note"]
    rank0 = by_rank[0]
    assert rank0["method"] == "proc" and rank0["note"] == "py-spy switched off"
    assert rank0["proc"]["state"] == "S" and rank0["proc"]["syscall"] in ("clock_nanosleep", "nanosleep", "select")
    assert "sleeper.py" in rank0["proc"]["cmdline"]


@pytest.mark.skipif(not stacks.local_py_spy(), reason="py-spy is installed by `make setup` (the test extra)")
def test_the_node_program_finds_py_spy_and_returns_the_ranks_frames(sleeping_rank):
    doc = run_program(sleeping_rank, [])   # not on PATH here: found next to the rank's own python
    rank0 = next(r for r in doc["ranks"] if r["rank"] == 0)
    assert rank0["method"] == "py-spy", rank0
    stack = stacks.rank_stack("node-1", rank0)
    assert stack.frames[0].key == ("stuck_here", "sleeper.py", 3)


def test_a_py_spy_that_fails_falls_back_to_proc_and_says_why(sleeping_rank, tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\necho 'Stack backtrace:' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    rank0 = next(r for r in run_program(sleeping_rank, [str(fake)])["ranks"] if r["rank"] == 0)
    assert rank0["method"] == "proc" and rank0["py_spy"] == str(fake)
    assert rank0["note"] == "py-spy failed: exit 1: Error: Operation not permitted (os error 1)"
    described = stacks.describe(stacks.rank_stack("node-1", rank0))
    assert described.startswith("[/proc; py-spy failed: exit 1: Error: Operation")


# ---- orchestration over a scripted transport ---------------------------------------------------


def answer(node: str, ranks: list[dict]) -> Reply:
    return Reply(json.dumps({"host": node, "job_dir": True, "ranks": ranks}) + "\n")


def asks_stacks(call) -> bool:
    return "def threads_from_py_spy" in (call.stdin or "")


@pytest.fixture
def job(ct_env) -> JobRecord:
    return saved_job(JOB, "st", 3, np=6)


def status_reply(job: JobRecord, alive: bool = True) -> Reply:
    import base64
    record = base64.b64encode(json.dumps(job.to_dict()).encode()).decode()
    return Reply(f"J {job.id} {'-' if alive else '0'} {int(alive)} 0 1 0 {record}\n")


def test_every_node_is_asked_and_one_that_does_not_answer_is_named(tmp_path, job):
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: 'echo "J $j' in (c.stdin or ""), status_reply(job))
    waiting, stuck = recorded("dump-event.json"), recorded("dump-sleep.json")
    fake.on(asks_stacks, answer("node-1", [entry(0, waiting, 10), entry(1, stuck, 11)]), node="node-1")
    fake.on(asks_stacks, answer("node-2", [entry(2, waiting, 12), entry(3, waiting, 13)]), node="node-2")
    fake.on(asks_stacks, Reply.unreachable("10.0.0.3"), node="node-3")
    result = stacks.stacks(ClusterSession.load("st", transport=fake), StacksRequest(JOB, py_spy=False))

    assert [g.label for g in result.groups] == ["ranks 0,2-3 (node-[1-2])", "rank 1 (node-1)"]
    assert result.problems == ["node-3: unreachable: connection refused"]
    assert result.exit_code == 255
    sent = [c for c in fake.calls if asks_stacks(c)]
    assert sorted(c.node for c in sent) == ["node-1", "node-2", "node-3"]
    assert all('"py_spy\\": false' in c.stdin for c in sent)
    doc = result.to_dict()
    assert doc["groups"][1]["ranks"] == [1] and doc["ranks"][1]["frames"][0]["function"] == "stuck_here"
    assert {t["name"] for t in doc["ranks"][1]["threads"]} == {"MainThread", "heartbeat"}


def test_ranks_nobody_reported_are_named(tmp_path, job):
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: 'echo "J $j' in (c.stdin or ""), status_reply(job))
    fake.on(asks_stacks, answer("node-1", [entry(0, recorded("dump-event.json"), 10)]), node="node-1")
    fake.on(asks_stacks, answer("node-x", []))
    result = stacks.stacks(ClusterSession.load("st", transport=fake), StacksRequest(JOB))
    assert result.problems == ["node-[2-3]: no rank of this job recorded there",
                               "ranks 1-5: no node reported them (not started yet, or gone)"]
    assert result.exit_code == 0


def test_a_job_that_has_ended_is_a_one_line_error(tmp_path, job):
    job.state, job.exit_code = "succeeded", 0
    records.save(job)
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: 'echo "J $j' in (c.stdin or ""), Reply(""))
    with pytest.raises(UsageError, match=f"job {JOB} is not running: it succeeded with exit code 0"):
        stacks.stacks(ClusterSession.load("st", transport=fake), StacksRequest(JOB))


def test_local_py_spy_lists_only_paths_that_exist():
    assert all(os.access(p, os.X_OK) for p in stacks.local_py_spy())
    assert (shutil.which("py-spy") is None) or shutil.which("py-spy") in stacks.local_py_spy()
