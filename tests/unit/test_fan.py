"""The leader's fan-out (nodeprogs/fan.py) that starts a node-launcher job's agents, and the agent's side of it.

Real processes: fan.py runs as the leader runs it (its own #! line, python3 -I -S); ``ssh`` is a stand-in on
PATH that runs the remote line here with sh (no sshd in a unit test: tests/local/test_launchers.py runs the
real one), so every node's agent is a local process with its own node rank, environment and stdin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertool import nodeprogs

pytestmark = pytest.mark.unit

JOB = "j1-fan"
# A stand-in agent: records its node rank and environment, then fails (FAIL_NODE) or waits for its stdin's end.
AGENT = '''
import json, os, sys
d = os.path.dirname(os.path.abspath(__file__))
k = os.environ["CLUSTERTOOL_AGENT_NODE"]
keys = ("CLUSTERTOOL_JOB", "GIVEN", "FORWARDED", "MASTER_PORT")
with open(os.path.join(d, "started." + k), "w") as fh:
    json.dump(dict({x: os.environ.get(x) for x in keys}, cwd=os.getcwd()), fh)
if k == os.environ.get("FAIL_NODE"):
    sys.exit(3)
sys.stdin.buffer.read()   # until the fan-out closes our end
open(os.path.join(d, "eof." + k), "w").close()
sys.exit(143)
'''
SSH = '#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n'   # ssh [options] host LINE -> sh -c LINE, here


@pytest.fixture
def leader(tmp_path):
    """A home with the job's folder (fan.py and the stand-in agent) and a PATH whose ssh runs lines here."""
    d = tmp_path / ".clustertool" / "jobs" / JOB
    d.mkdir(parents=True)
    shutil.copy(nodeprogs.DIR / "fan.py", d / "fan.py")
    (d / "fan.py").chmod(0o755)
    (d / "jobagent.py").write_text(AGENT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(SSH)
    (bin_dir / "ssh").chmod(0o755)
    (bin_dir / "python3").symlink_to(shutil.which("python3") or sys.executable)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin", "CLUSTERTOOL_JOB": JOB, "FORWARDED": "yes"}
    return d, env


def started(d: Path, k: int) -> dict:
    return json.loads((d / f"started.{k}").read_text())


def fan(d: Path, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(d / "fan.py"), "-H", "10.0.0.1,10.0.0.2,10.0.0.3", "-x", f"CLUSTERTOOL_JOB={JOB}",
                             "-x", "GIVEN=a b $HOME", "-x", "FORWARDED", "-x", "MASTER_PORT=PORT",
                             "-free-port", "MASTER_PORT", *args], env=env, cwd=d,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


def test_the_first_agent_that_fails_stops_every_other_and_gives_the_job_its_code(leader):
    d, env = leader
    proc = fan(d, dict(env, FAIL_NODE="2"))   # the last one started: every other has started by then
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert sorted(p.name for p in d.glob("eof.*")) == ["eof.0", "eof.1"]   # told by their stdin's end
    for k in range(3):   # each its node rank, the job's variables as given, a bare -x from the leader's own
        seen = started(d, k)
        assert (seen["CLUSTERTOOL_JOB"], seen["GIVEN"], seen["FORWARDED"]) == (JOB, "a b $HOME", "yes")
    ports = {started(d, k)["MASTER_PORT"] for k in range(3)}   # one port, picked on the leader as it started
    assert len(ports) == 1 and ports.pop().isdigit()


def test_a_signal_to_the_fan_out_stops_every_agent(leader):
    d, env = leader
    proc = fan(d, env, "-wdir", str(d.parent))
    for k in range(3):
        wait_for(d / f"started.{k}")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert sorted(p.name for p in d.glob("eof.*")) == ["eof.0", "eof.1", "eof.2"]
    assert started(d, 1)["cwd"] == started(d, 2)["cwd"] == str(d.parent)   # -wdir on the other nodes


def test_a_node_whose_ssh_and_sshd_fail_is_written_lost_and_stops_the_job(leader):
    d, env = leader
    (Path(env["HOME"]) / "bin" / "ssh").write_text('#!/bin/sh\ncase "$*" in *AGENT_NODE=2*) exit 255;; esac\n'
                                                   'for last; do :; done\nexec sh -c "$last"\n')
    proc = subprocess.Popen([str(d / "fan.py"), "-H", "10.0.0.1,10.0.0.2,127.0.0.1:9"], env=env, cwd=d,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 255
    assert "127.0.0.1 stopped answering (ssh exit 255); stopping the job" in err
    lost = json.loads((d / "lost").read_text())
    assert lost["kind"] == "lost" and lost["address"] == "127.0.0.1"
    assert sorted(p.name for p in d.glob("eof.*")) == ["eof.0", "eof.1"]


def test_a_node_agent_whose_stdin_closes_stops_its_ranks(tmp_path):
    """The real agent under the fan-out: its stdin is the leader's end; closed, it stops its ranks as on SIGTERM."""
    from clustertool.nodeprogs import jobagent

    shutil.copy(jobagent.__file__, tmp_path / "jobagent.py")
    plan = {"launcher": "process", "out": str(tmp_path / "out"), "width": 1, "world_size": 2,
            "program": {"mode": "exec", "argv": ["sleep", "60"]}, "nodes": [{"nprocs": 2, "first_rank": 0}]}
    (tmp_path / "agent.json").write_text(json.dumps(plan))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CLUSTERTOOL_AGENT_NODE": "0"}
    agent = subprocess.Popen(["python3", "-I", "-S", str(tmp_path / "jobagent.py")], stdin=subprocess.PIPE, env=env,
                             stderr=subprocess.PIPE, text=True)
    ranks = tmp_path / "ranks"
    deadline = time.monotonic() + 30
    while len(list(ranks.glob("*"))) < 2:
        assert time.monotonic() < deadline and agent.poll() is None, "the ranks never started"
        time.sleep(0.05)
    pids = [int(p.read_text().split()[0]) for p in ranks.glob("*")]
    agent.stdin.close()
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM, agent.stderr.read()
    exits = [json.loads(p.read_text()) for p in (tmp_path / "exits").glob("*")]
    assert sorted((e["rank"], e["signal"], e["stopped"]) for e in exits) == [(0, 15, True), (1, 15, True)]
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_rank_runner_gets_the_launchers_own_python(tmp_path):
    """torchrun/accelerate run the agent as it is (#!: -I -S); the user's program keeps the launcher's python."""
    from clustertool.nodeprogs import jobagent

    py = tmp_path / "venv" / "bin" / "python3"
    py.parent.mkdir(parents=True)
    py.symlink_to(sys.executable)
    for name, first in (("torchrun", f"#!{py}\n"), ("accelerate", "#!/usr/bin/env python3\n"),
                        ("wrapped", "#!/bin/sh\nexec python3 -m x\n")):
        (py.parent / name).write_text(first)
        (py.parent / name).chmod(0o755)
    env = {"PATH": f"{py.parent}:/usr/bin:/bin"}
    assert jobagent.launcher_python("torchrun", env) == str(py)
    assert jobagent.launcher_python("accelerate", env) == str(py)   # env's python3: the first on its PATH
    assert jobagent.launcher_python("python3", env) == str(py)
    assert jobagent.launcher_python("wrapped", env) is None   # not plainly a python: the rank runner's own
    assert jobagent.rank_command({"mode": "python", "target": "t.py", "python": str(py)}, ["--lr", "1"]) == [
        str(py), "-u", "t.py", "--lr", "1"]


def launcher_agent(tmp_path: Path, launcher: str, line: str, nprocs: int = 1, first_rank: int = 0,
                   env: dict | None = None) -> list[str]:
    """The real agent's command for a node whose launcher is ``sh -c LINE`` (agent.json written beside it)."""
    from clustertool.nodeprogs import jobagent

    shutil.copy(jobagent.__file__, tmp_path / "jobagent.py")
    plan = {"launcher": launcher, "out": str(tmp_path / "out"), "width": 1, "world_size": first_rank + nprocs,
            "program": {"mode": "python", "target": "t.py"},
            "nodes": [{"nprocs": nprocs, "first_rank": first_rank, "argv": ["sh", "-c", line]}]}
    (tmp_path / "agent.json").write_text(json.dumps(plan))
    return ["python3", "-I", "-S", str(tmp_path / "jobagent.py")]


def pid_written(path: Path) -> int:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.05)
    return int(path.read_text())


def gone_or_zombie(pid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while os.path.exists(f"/proc/{pid}") and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the launcher's child outlived the job"
        time.sleep(0.05)


AGENT_ENV = {"PATH": "/usr/bin:/bin", "CLUSTERTOOL_AGENT_NODE": "0"}


def test_a_stopped_launcher_leaves_nothing_of_what_it_started(tmp_path):
    """DeepSpeed's runner starts its per-node launcher, which starts the ranks; SIGTERM kills the runner alone.
    The agent signals the launcher's whole process group (as mpirun's daemons did): nothing is left."""
    left = tmp_path / "grandchild.pid"
    line = f"sleep 60 & echo $! > {left}; wait"   # the shell dies of SIGTERM; its sleep would outlive it
    agent = subprocess.Popen(launcher_agent(tmp_path, "deepspeed", line), stdin=subprocess.PIPE,
                             env=dict(AGENT_ENV, HOME=str(tmp_path)))
    pid = pid_written(left)
    agent.stdin.close()
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM
    gone_or_zombie(pid)


def test_a_launcher_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    """torchrun in its exit barrier takes no SIGTERM until the barrier's own 300 s are up: the agent kills the
    launcher's group after its grace (inside fan.py's), so no launcher outlives its job on the leader."""
    from clustertool.nodeprogs import jobagent
    from clustertool.nodeprogs.fan import GRACE_S

    left = tmp_path / "child.pid"
    line = f"trap '' TERM; sleep 120 & echo $! > {left}; wait"   # deaf to SIGTERM, as its child is
    agent = subprocess.Popen(launcher_agent(tmp_path, "torchrun", line), stdin=subprocess.PIPE,
                             env=dict(AGENT_ENV, HOME=str(tmp_path)))
    pid = pid_written(left)
    agent.stdin.close()
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM   # not the sleep's 120 s
    assert jobagent.STOP_GRACE_S < GRACE_S   # fan.py SIGKILLs the leader's agent then
    gone_or_zombie(pid)


@pytest.mark.parametrize("code", [0, 1])
def test_what_the_launcher_writes_after_its_ranks_ended_well_is_one_line_when_it_ends_well(tmp_path, code):
    """torchrun's exit barrier fails with c10d errors where node 0's launcher ended first (PyTorch's race): after
    every rank on the node ended well, and the launcher too, the job's log gets one line, the lines a file."""
    exits = tmp_path / "exits"
    line = (f"echo 'starting' >&2; mkdir -p {exits}; for r in 2 3; do "
            f"echo '{{\"code\": 0}}' > {exits}/$(uname -n).$r; done; "
            f"echo '[c10d] Error waiting on exit barrier' >&2; exit {code}")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_PROCID": "0"}   # no stdin to watch
    agent = subprocess.run(launcher_agent(tmp_path, "torchrun", line, nprocs=2, first_rank=2), env=env,
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode == code
    assert "starting" in agent.stderr   # before the ranks ended: as it came
    kept = tmp_path / f"teardown.{os.uname().nodename}"
    if code == 0:
        assert "[c10d]" not in agent.stderr and "sh on " in agent.stderr and str(kept) in agent.stderr
        assert kept.read_text() == "[c10d] Error waiting on exit barrier\n"
    else:   # a launcher that failed shows all it wrote
        assert "[c10d] Error waiting on exit barrier" in agent.stderr and not kept.exists()


def test_a_preemption_notice_passed_on_to_the_launcher_does_not_end_it(tmp_path):
    """--on-preempt-signal USR1 reaches the agent, which passes it on; only a stopping signal starts the kill grace."""
    from clustertool.nodeprogs import jobagent

    left = tmp_path / "child.pid"
    line = f"trap '' TERM USR1; sleep 120 & echo $! > {left}; wait"
    agent = subprocess.Popen(launcher_agent(tmp_path, "torchrun", line), stdin=subprocess.PIPE,
                             env=dict(AGENT_ENV, HOME=str(tmp_path)))
    pid = pid_written(left)
    agent.send_signal(signal.SIGUSR1)
    time.sleep(jobagent.STOP_GRACE_S + 1)
    assert agent.poll() is None and os.path.exists(f"/proc/{pid}")   # the launcher and its child run on
    agent.stdin.close()
    assert agent.wait(timeout=30) in (128 + signal.SIGTERM, 128 + signal.SIGUSR1)
    gone_or_zombie(pid)
