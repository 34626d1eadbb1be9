"""The warm node launcher (nodeprogs/warmlaunch.py) and the job agent's side of it (jobagent.py), with a small
console script in torchrun's shape instead of torchrun: what the launcher forked for a job sees (its command
line, environment, working folder, files), what /proc says of it, its end and signals, a changed script, and
the agent gone.  Real processes; no torch (tests/local/test_launchers.py has torchrun itself)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from clustertool.nodeprogs import jobagent, warmlaunch

PACKAGE = '''
import json, os, sys, time
IMPORTED_IN = os.getpid()


def main():
    out = sys.argv[1]
    with open(out, "w") as fh:
        json.dump({"argv": sys.argv, "cwd": os.getcwd(), "job": os.environ.get("CLUSTERTOOL_JOB"),
                   "imported_in_another": IMPORTED_IN != os.getpid(),
                   "proc_env": open("/proc/self/environ", "rb").read().decode().split("\\0"),
                   "proc_cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0"),
                   "comm": open("/proc/self/comm").read().strip(), "pgid": os.getpgid(0)}, fh)
    sys.stderr.write("said on stderr\\n")
    if sys.argv[2] == "sleep":
        time.sleep(60)
    return int(sys.argv[2])
'''


@pytest.fixture
def setup(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "fakelaunch.py").write_text(PACKAGE)
    script = tmp_path / "fakerun"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom fakelaunch import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main())\n")
    script.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(jobagent.NODE_ENV, "0")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(tmp_path / "lib"),
           "CLUSTERTOOL_JOB": "j1128-abcdef", "MASTER_ADDR": "10.0.0.1"}
    plan = jobagent.warm_plan(str(script), env)
    assert plan is not None
    yield tmp_path, script, env, plan
    for pid in servers(plan["key"]):
        os.kill(pid, signal.SIGTERM)


def servers(key: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and f"CLUSTERTOOL_WARM_KEY={key}".encode() in \
                    Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            pass
    return found


def ready(plan: dict) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(plan["path"]):
        assert time.monotonic() < deadline, "the warm launcher never made its socket"
        time.sleep(0.05)


def test_no_warm_launcher_yet_means_a_cold_start_then_one_serves_the_next(setup):
    tmp, script, env, plan = setup
    assert jobagent.warm_start(plan, [str(script), str(tmp / "a.json"), "0"], env) is None
    jobagent.start_warm(plan)
    ready(plan)
    assert oct(os.stat(plan["path"]).st_mode & 0o777) == "0o600"
    assert oct(os.stat(plan["folder"]).st_mode & 0o777) == "0o700"
    os.chdir(tmp)
    child = jobagent.warm_start(plan, [str(script), str(tmp / "a.json"), "7"], env)
    assert child is not None
    assert child.wait() == 7
    assert child.stderr.read() == b"said on stderr\n"
    seen = json.loads((tmp / "a.json").read_text())
    assert seen["imported_in_another"]   # the import was the warm launcher's, before the fork
    assert seen["argv"] == [str(script), str(tmp / "a.json"), "7"] and seen["cwd"] == str(tmp)
    assert seen["job"] == "j1128-abcdef" and seen["pgid"] == child.pid
    # /proc says what it says of a launcher started by hand: `kill` and doctor find the job's processes by it
    assert "CLUSTERTOOL_JOB=j1128-abcdef" in seen["proc_env"] and "MASTER_ADDR=10.0.0.1" in seen["proc_env"]
    assert not any(e.startswith("CLUSTERTOOL_WARM_") for e in seen["proc_env"])
    assert seen["proc_cmdline"][:4] == [sys.executable, str(script), str(tmp / "a.json"), "7"]
    assert seen["comm"] == "fakerun"
    assert len(servers(plan["key"])) == 1   # still there, for the next job


def test_signals_reach_the_launchers_group_and_the_agent_gone_stops_it(setup):
    tmp, script, env, plan = setup
    jobagent.start_warm(plan)
    ready(plan)
    child = jobagent.warm_start(plan, [str(script), str(tmp / "b.json"), "sleep"], env)
    while not (tmp / "b.json").exists():
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait() == -signal.SIGTERM
    other = jobagent.warm_start(plan, [str(script), str(tmp / "c.json"), "sleep"], env)
    while not (tmp / "c.json").exists():
        time.sleep(0.05)
    assert other.poll() is None
    other.sock.close()   # as the agent's death closes it
    deadline = time.monotonic() + 10
    while other.alive():
        assert time.monotonic() < deadline, "the launcher outlived its agent"
        time.sleep(0.05)


def test_a_changed_launcher_script_is_started_cold_and_its_warm_launcher_ends(setup):
    tmp, script, env, plan = setup
    jobagent.start_warm(plan)
    ready(plan)
    [pid] = servers(plan["key"])
    stat = script.stat()
    os.utime(script, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # as `pip install -U` leaves it
    assert jobagent.warm_start(plan, [str(script), str(tmp / "d.json"), "0"], env) is None
    deadline = time.monotonic() + 10
    while servers(plan["key"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not os.path.exists(plan["path"])
    jobagent.start_warm(plan)   # the agent's next step: a new one, for the next job
    ready(plan)
    assert servers(plan["key"]) and servers(plan["key"]) != [pid]


def test_what_the_imports_read_of_the_environment_keys_the_warm_launcher(setup):
    _tmp, script, env, plan = setup
    same = jobagent.warm_plan(str(script), dict(env, MASTER_ADDR="10.0.0.2", CLUSTERTOOL_JOB="j2"))
    assert same["key"] == plan["key"]
    assert jobagent.warm_plan(str(script), dict(env, LOGLEVEL="INFO"))["key"] != plan["key"]
    assert jobagent.warm_plan(str(script), dict(env, TORCH_CPP_LOG_LEVEL="INFO"))["key"] != plan["key"]
    assert jobagent.warm_plan(str(script), dict(env, CLUSTERTOOL_WARM="0")) is None
    assert jobagent.warm_plan(str(script), dict(env, SLURM_JOB_ID="4")) is None
    assert jobagent.warm_plan(sys.executable, env) is None   # `python -m ...`: nothing to keep warm


def test_the_lowest_priority_only_where_the_way_back_is_allowed():
    assert warmlaunch.idle_allowed(0, 0)             # root
    assert not warmlaunch.idle_allowed(1000, 0)      # a user with the usual RLIMIT_NICE: imports at nice 0
    assert warmlaunch.idle_allowed(1000, 20) and warmlaunch.idle_allowed(1000, -1)
