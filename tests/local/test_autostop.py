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
from tests.local import nodehost

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


def _watcher(env: dict, name: str, file: str) -> dict:
    """The leader's watcher's config.json or state.json, read here (written by rename: never half)."""
    try:
        return json.loads((_home(env, name, "node-1") / ".clustertool" / "autostop" / file).read_text())
    except (OSError, ValueError):
        return {}


def _held_up_past_the_window(env: dict, name: str, why: str, windows: int = 1, since: float = 0.0) -> dict:
    """Wait until the watcher, set at config.json's ``set_at`` (sampling again since ``since``: after a `start`),
    has sampled the cluster busy for ``why`` over more than ``windows`` idle windows: an idle cluster is stopped
    at the first sample an idle window after its first idle one, so by then the watcher would have stopped it.
    Every sample seen must say ``why``.  The samples are the event waited for, not a sleep the watcher may lag
    behind on a loaded machine."""
    config = _watcher(env, name, "config.json")
    idle_s, set_at = float(config["idle_s"]), max(float(config["set_at"]), since)
    first: list[float] = []

    def past() -> dict | None:
        sample = _watcher(env, name, "state.json")
        checked = float(sample.get("checked") or 0)
        if checked < set_at:
            return None
        assert any(why in reason for reason in sample.get("busy", [])), (sample, _log(env, name))
        first.append(checked)
        return sample if checked >= first[0] + windows * idle_s else None

    return nodehost.wait_for(past, f"watcher samples busy ({why}) over {windows} idle window(s)", timeout=300,
                             every=0.2)


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

    _held_up_past_the_window(env, name, "node-3 GPU busy", windows=2)  # with node-3's GPU at 93%
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)
    shown = run_cli("autostop", "-c", name, "--json", env=env)
    assert any("node-3 GPU busy (93/93%)" in why for why in json.loads(shown.stdout)["leader"]["busy"])

    (_home(env, name, "node-3") / "gpu-util").write_text("0\n")
    idle_from = time.monotonic()
    stopped_at = _wait_stopped(env, name, limit=180)
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
    gate = nodehost.Gate(env, name, ["node-1"])  # the job runs until the test opens its gate
    job = run_cli("run", "-c", name, "--nodes", "leader", "--np", "1", "--json", "--", *gate.command, env=env)
    assert job.returncode == 0, job.stderr
    job_dir = _home(env, name, "node-1") / ".clustertool" / "jobs" / json.loads(job.stdout)["id"]
    proc = run_cli("autostop", "-c", name, "3s", env=env)
    assert proc.returncode == 0, proc.stderr
    _held_up_past_the_window(env, name, "job(s) running")  # GPUs idle, but the job runs
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)
    shown = json.loads(run_cli("autostop", "-c", name, "--json", env=env).stdout)
    assert any(why.startswith("job(s) running") for why in shown["leader"]["busy"])
    # the watcher calls itself ct-autostop: `kill --all-python` and doctor's stray check leave it alone
    named = run_cli("exec", "-c", name, "--nodes", "leader", "--", "pgrep -x ct-autostop && ! pgrep -x python3",
                    env=env)
    assert named.returncode == 0, named.stdout + named.stderr

    cancel = run_cli("autostop", "-c", name, "--cancel", env=env)
    assert cancel.returncode == 0 and "autostop cancelled" in cancel.stdout
    gate.open()
    ended = nodehost.wait_for(lambda: (job_dir / "exit").exists() and (job_dir / "exit").stat().st_mtime, "job end")
    # the job has ended, everything is idle: the watcher goes on sampling, cancelled, past an idle window, and
    # nothing stops
    nodehost.wait_for(lambda: _watcher(env, name, "state.json").get("cancelled")
                      and float(_watcher(env, name, "state.json")["checked"]) >= ended + 3 + 1,
                      "a cancelled sample an idle window after the job ended", timeout=300, every=0.2)
    assert _states(env, name) == ("ready", ["running"] * 4), _log(env, name)

    assert run_cli("autostop", "-c", name, "3s", env=env).returncode == 0
    _wait_stopped(env, name, limit=180)
    (_home(env, name, "node-2") / "gpu-util").write_text("93\n")  # busy from the boot on: `start` stays up
    started = run_cli("start", "-c", name, env=env)
    assert started.returncode == 0, started.stderr
    assert _states(env, name) == ("ready", ["running"] * 4)
    # the watcher came back with the node (its boot script): it samples again, then stops the idle cluster
    _held_up_past_the_window(env, name, "node-2 GPU busy", since=time.time())
    (_home(env, name, "node-2") / "gpu-util").write_text("0\n")
    _wait_stopped(env, name, limit=180)


def test_wait_for_jobs_and_ssh_counts_an_interactive_session_set_through_the_api(local_cluster, env, monkeypatch):
    import subprocess

    from clustertool import Cluster
    from clustertool.core import state
    from clustertool.remote import transport

    monkeypatch.setenv("CLUSTERTOOL_AUTOSTOP_INTERVAL", "1")
    name = local_cluster(2, env=env)
    _install_stand_in(env, name, 2)
    cluster = Cluster.load(name)
    argv = transport.ssh_argv(name, state.load(name).node("node-2"), "sleep infinity", tty=True, extra=["-t"])
    session = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = cluster.autostop("3s", wait_for="jobs-and-ssh")
        assert result.to_dict()["autostop"] == {"idle_s": 3, "down": False, "wait_for": "jobs-and-ssh"}
        _held_up_past_the_window(env, name, "node-2: 1 interactive ssh session(s)")  # idle GPUs, no job
        assert _states(env, name) == ("ready", ["running"] * 2), _log(env, name)
        assert "node-2: 1 interactive ssh session(s)" in cluster.autostop().view.state["busy"]
    finally:
        session.kill()
        session.wait()
    _wait_stopped(env, name, limit=180)


def test_local_autodown_powers_off_then_the_next_command_tears_the_cluster_down(local_cluster, env):
    from tests.local.conftest import local_leftovers

    name = local_cluster(2, "--autostop", "3s", "--autodown", env=env)
    marker = _home(env, name, "node-1") / ".clustertool" / "autostop" / "poweroff.json"
    nodehost.wait_for(marker.exists, "the watcher's power-off", timeout=300, every=0.5)  # no command looks meanwhile
    assert json.loads(marker.read_text())["action"] == "down"
    # the power-off itself, members then the leader: every node's processes end (sshd, then its PID 1)
    nodehost.wait_for(lambda: not any(nodehost.processes(env, name, i) for i in (1, 2)), "the nodes powered off",
                      timeout=300, every=0.2)
    listed = run_cli("ls", env=env)
    assert "autodowned" in listed.stdout and f"{name}: the cluster's watcher terminated it" in listed.stderr
    listed = run_cli("ls", "--json", env=env)
    assert [c["status"] for c in json.loads(listed.stdout) if c["name"] == name] == ["autodowned"]
    assert local_leftovers(name) == []  # namespaces and processes gone before `down`
    status = run_cli("status", "-c", name, env=env)
    assert status.returncode == 0 and "autodowned" in status.stdout
    assert run_cli("down", "-c", name, "--yes", env=env).returncode == 0
