"""Autostop on a real local cluster: the leader's watcher samples jobs and GPU use over the cluster's
own SSH mesh and powers the nodes off after the idle window -- not before, not while a job runs,
not after --cancel.

There is no GPU here: every node gets a STAND-IN ``nvidia-smi`` (a shell script in the node's
``~/.local/bin``, which the watcher's probe puts first on PATH) that prints the utilisation written
in the node's ``~/gpu-util`` file, so a test can make a node's GPU busy, then idle.  The sampling
interval is the hidden knob ``CLUSTERTOOL_AUTOSTOP_INTERVAL`` (1 s instead of a minute).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.local

STAND_IN = """#!/bin/sh
# STAND-IN for nvidia-smi (no GPU on this test machine): one line per GPU, the utilisation in
# percent written in ~/gpu-util (0 when the file is missing), as
# `nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits` prints it.
u=$(cat "$HOME/gpu-util" 2>/dev/null || echo 0)
echo "$u"
echo "$u"
"""


def _home(env: dict, name: str, node: str) -> Path:
    return Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "local" / node / "home"


def _install_stand_in(env: dict, name: str, nodes: int, busy_node: str | None = None) -> None:
    for i in range(1, nodes + 1):
        home = _home(env, name, f"node-{i}")
        bin_dir = home / ".local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "nvidia-smi").write_text(STAND_IN)
        (bin_dir / "nvidia-smi").chmod(0o755)
        (home / "gpu-util").write_text("93\n" if f"node-{i}" == busy_node else "0\n")


def _states(env: dict, name: str) -> tuple[str, list[str]]:
    proc = run_cli("status", "-c", name, "--json", "--no-check", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    return data["status"], [n["state"] for n in data["nodes"]]


def _log(env: dict, name: str) -> str:
    path = _home(env, name, "node-1") / ".clustertool" / "autostop" / "autostop.log"
    return path.read_text() if path.exists() else "(no log)"


def _wait_stopped(env: dict, name: str, limit: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        status, states = _states(env, name)
        if set(states) == {"stopped"}:
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"cluster {name} did not stop within {limit}s: {_states(env, name)}")


@pytest.fixture
def env(ct_env):
    return dict(ct_env, CLUSTERTOOL_AUTOSTOP_INTERVAL="1")


def test_busy_gpu_holds_the_cluster_up_then_it_stops_after_the_idle_window_and_not_before(local_cluster, env):
    name = local_cluster(4, env=env)
    _install_stand_in(env, name, 4, busy_node="node-3")
    proc = run_cli("autostop", "-c", name, "4s", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "stop every node after 4s idle" in proc.stdout and "watcher: loop" in proc.stdout

    time.sleep(9)  # more than twice the window, with node-3's GPU at 93%
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)
    shown = run_cli("autostop", "-c", name, "--json", env=env)
    assert any("node-3 GPU busy (93/93%)" in why for why in json.loads(shown.stdout)["leader"]["busy"])

    (_home(env, name, "node-3") / "gpu-util").write_text("0\n")
    idle_from = time.monotonic()
    stopped_at = _wait_stopped(env, name, limit=30)
    assert stopped_at - idle_from >= 4, "stopped before the idle window had passed"

    status = run_cli("status", "-c", name, env=env)
    assert "autostopped" in status.stdout and "idle for" in status.stdout
    log = (_home(env, name, "node-1") / ".clustertool" / "autostop" / "autostop.log").read_text()
    assert "node-3 GPU busy" in log
    order = [line for line in log.splitlines() if "power-off sent" in line or "leader: powering off" in line]
    assert [line.split()[1] for line in order] == ["node-2:", "node-3:", "node-4:", "leader:"]  # members first

    listed = json.loads(run_cli("ls", "--json", env=env).stdout)
    assert [c["status"] for c in listed if c["name"] == name] == ["autostopped"]
    ledger = [json.loads(line) for line in (Path(env["CLUSTERTOOL_HOME"]) / "ledger.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ledger if e["name"] == name] == ["up", "autostop"]
    cost = json.loads(run_cli("cost", "--json", env=env).stdout)
    [row] = [c for c in cost["clusters"] if c["name"] == name]
    assert (row["state"], row["nodes"], row["type"], row["cost_usd"]) == ("autostopped", 4, "local", 0.0)
    assert row["hours_up"] > 0 and row["hours_saved"] > 0 and cost["approximate"] is True


def test_a_running_job_and_then_cancel_hold_the_cluster_up_and_start_brings_the_watcher_back(local_cluster, env):
    name = local_cluster(4, env=env)
    _install_stand_in(env, name, 4)
    job = run_cli("run", "-c", name, "--nodes", "leader", "--np", "1", "--", "sleep", "15", env=env)
    assert job.returncode == 0, job.stderr
    proc = run_cli("autostop", "-c", name, "3s", env=env)
    assert proc.returncode == 0, proc.stderr
    time.sleep(5)  # GPUs idle, but the job runs
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)
    shown = json.loads(run_cli("autostop", "-c", name, "--json", env=env).stdout)
    assert any(why.startswith("job(s) running") for why in shown["leader"]["busy"])
    # the watcher calls itself ct-autostop: `kill --all-python` and doctor's stray check leave it alone
    named = run_cli("exec", "-c", name, "--nodes", "leader", "--", "pgrep -x ct-autostop && ! pgrep -x python3",
                    env=env)
    assert named.returncode == 0, named.stdout + named.stderr

    cancel = run_cli("autostop", "-c", name, "--cancel", env=env)
    assert cancel.returncode == 0 and "autostop cancelled" in cancel.stdout
    time.sleep(14)  # the job has ended, everything is idle: cancelled, so nothing stops
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)

    assert run_cli("autostop", "-c", name, "3s", env=env).returncode == 0
    _wait_stopped(env, name, limit=30)
    started = run_cli("start", "-c", name, env=env)
    assert started.returncode == 0, started.stderr
    assert _states(env, name) == ("ready", ["running"] * 4)
    _wait_stopped(env, name, limit=30)  # the watcher came back with the node (its boot script)


def test_wait_for_jobs_and_ssh_counts_an_interactive_session_set_through_the_api(local_cluster, env, monkeypatch):
    import subprocess

    from clustertool import Cluster
    from clustertool.core import state
    from clustertool.remote import transport

    monkeypatch.setenv("CLUSTERTOOL_AUTOSTOP_INTERVAL", "1")
    name = local_cluster(2, env=env)
    _install_stand_in(env, name, 2)
    cluster = Cluster.load(name)
    argv = transport.ssh_argv(name, state.load(name).node("node-2"), "sleep 60", tty=True, extra=["-t"])
    session = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = cluster.autostop("3s", wait_for="jobs-and-ssh")
        assert result.to_dict()["autostop"] == {"idle_s": 3, "down": False, "wait_for": "jobs-and-ssh"}
        time.sleep(7)  # idle GPUs, no job, but an interactive session on node-2
        assert _states(env, name) == ("ready", ["running"] * 2), _log(env, name)
        assert "node-2: 1 interactive ssh session(s)" in cluster.autostop().view.state["busy"]
    finally:
        session.kill()
        session.wait()
    _wait_stopped(env, name, limit=30)


def test_local_autodown_powers_off_then_the_next_command_tears_the_cluster_down(local_cluster, env):
    from tests.local.conftest import local_leftovers

    name = local_cluster(2, "--autostop", "3s", "--autodown", env=env)
    marker = _home(env, name, "node-1") / ".clustertool" / "autostop" / "poweroff.json"
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:  # no command looks meanwhile
        time.sleep(0.5)
    assert json.loads(marker.read_text())["action"] == "down"
    time.sleep(2)  # the power-off itself: members, then the leader
    listed = run_cli("ls", env=env)
    assert "autodowned" in listed.stdout and f"{name}: the cluster's watcher terminated it" in listed.stderr
    listed = run_cli("ls", "--json", env=env)
    assert [c["status"] for c in json.loads(listed.stdout) if c["name"] == name] == ["autodowned"]
    assert local_leftovers(name) == []  # namespaces and processes gone before `down`
    status = run_cli("status", "-c", name, env=env)
    assert status.returncode == 0 and "autodowned" in status.stdout
    assert run_cli("down", "-c", name, "--yes", env=env).returncode == 0
