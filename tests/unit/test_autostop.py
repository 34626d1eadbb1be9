"""The autostop watcher's decisions (nodeprogs/autostop.py, pure parts) and the host side's setting,
config and parsing (clustertool/autostop.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

from clustertool.cluster import autostop, spec
from clustertool.core.errors import SpecError, UsageError
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, Node
from clustertool.nodeprogs import DIR
from clustertool.providers.aws import az_launch

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("watcher", DIR / "autostop.py")
watcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(watcher)


def _cluster() -> ClusterRecord:
    nodes = [Node(name=f"node-{i}", index=i, address=f"10.0.0.{i}", role=LEADER if i == 1 else MEMBER)
             for i in (1, 2, 3)]
    return ClusterRecord(name="c", provider="local", nodes=nodes, status="ready")


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("90s", 90), ("45", 2700),
                                          ("2h5m10s", 7510)])
def test_idle_times_read_as_users_write_them(text, seconds):
    assert autostop.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "30x", "0", "-5m", "m"])
def test_a_bad_idle_time_is_one_usage_error(text):
    with pytest.raises(UsageError, match="idle time"):
        autostop.parse_duration(text)


def test_format_duration_round_trips():
    assert [autostop.format_duration(s) for s in (5, 60, 1800, 5400, 3661)] == ["5s", "1m", "30m", "1h30m", "1h1m1s"]


def test_idle_clock_starts_at_the_first_idle_sample_and_acts_only_after_the_window():
    config = {"idle_s": 60, "down": False, "set_at": 1000}
    state, action = watcher.decide(config, {}, [], now=1010)
    assert (state["idle_since"], action) == (1010, None)
    state, action = watcher.decide(config, state, [], now=1069)
    assert action is None  # 59 s idle: not yet
    state, action = watcher.decide(config, state, [], now=1070)
    assert action == "stop"


def test_a_busy_sample_restarts_the_idle_clock():
    config = {"idle_s": 60, "set_at": 0}
    state, _ = watcher.decide(config, {}, [], now=100)
    state, action = watcher.decide(config, state, ["job(s) running: j1"], now=150)
    assert state["idle_since"] is None and action is None
    state, action = watcher.decide(config, state, [], now=155)
    state, action = watcher.decide(config, state, [], now=200)
    assert state["idle_since"] == 155 and action is None


def test_autodown_terminates_and_cancel_never_acts():
    state, action = watcher.decide({"idle_s": 10, "down": True}, {"idle_since": 0}, [], now=20)
    assert action == "down"
    state, action = watcher.decide({"idle_s": None}, {"idle_since": 0}, [], now=10_000)
    assert action is None and state["idle_since"] is None


def test_a_new_setting_or_a_boot_after_the_clock_started_starts_it_again():
    old = {"idle_since": 100}
    state, action = watcher.decide({"idle_s": 60, "set_at": 500}, old, [], now=600)
    assert (state["idle_since"], action) == (600, None)  # not 500 s idle: the setting is 100 s old
    state, action = watcher.decide({"idle_s": 60, "set_at": 0}, old, [], now=600, boot=590)
    assert (state["idle_since"], action) == (600, None)  # started since: a `start` after an autostop


def test_probe_output_parses_gpus_none_errors_and_ssh_sessions():
    assert watcher.parse_probe("gpu 93 0\nssh 2\n") == {"gpus": [93.0, 0.0], "ssh": 2}
    assert watcher.parse_probe("gpu none\nssh 0\n") == {"gpus": None, "ssh": 0}
    assert watcher.parse_probe("gpu error\nssh 1\n")["gpus"] == "error"


def test_busy_reasons_count_gpus_over_the_threshold_and_ssh_only_when_asked():
    probes = {"node-1": {"gpus": [0.0, 3.0], "ssh": 1}, "node-2": {"gpus": [0.0, 71.0], "ssh": 0},
              "node-3": {"gpus": None, "ssh": 0}, "node-4": None}
    reasons, notes = watcher.busy_reasons({"wait_for": "jobs"}, [], probes)
    assert reasons == ["node-2 GPU busy (0/71%)"] and notes == ["node-4 unreachable"]
    reasons, _ = watcher.busy_reasons({"wait_for": "jobs-and-ssh"}, ["j1"], probes)
    assert reasons == ["job(s) running: j1", "node-1: 1 interactive ssh session(s)", "node-2 GPU busy (0/71%)"]
    idle, _ = watcher.busy_reasons({"wait_for": "jobs"}, [], {"node-1": {"gpus": [4.9], "ssh": 3}})
    assert idle == []


def test_running_jobs_are_job_folders_whose_launcher_lives_with_the_job_marker(tmp_path):
    me = str(os.getpid())
    for job, files in {"jdone": {"job.json": "{}", "exit": "0", "launch.pid": me},
                       "jlive": {"job.json": "{}", "launch.pid": f"{me} 1 1 1"},
                       "jnew": {"job.json": "{}"}, "nojson": {"launch.pid": me}}.items():
        (tmp_path / job).mkdir()
        for name, text in files.items():
            (tmp_path / job / name).write_text(text)
    # jlive's launch.pid names this test process, which carries no CLUSTERTOOL_JOB=jlive: not running
    assert watcher.running_jobs(str(tmp_path)) == ["jnew"]  # a new folder counts (being started)
    old = time.time() - 120
    os.utime(tmp_path / "jnew" / "job.json", (old, old))
    assert watcher.running_jobs(str(tmp_path)) == []


def test_running_jobs_sees_a_process_that_carries_the_job_marker(tmp_path):
    import subprocess

    proc = subprocess.Popen(["sleep", "30"], env={watcher.JOB_ENV: "jlive", "PATH": os.environ["PATH"]})
    try:
        (tmp_path / "jlive").mkdir()
        (tmp_path / "jlive" / "job.json").write_text("{}")
        (tmp_path / "jlive" / "launch.pid").write_text(f"{proc.pid} 1 1 1\n")
        assert watcher.running_jobs(str(tmp_path)) == ["jlive"]
    finally:
        proc.kill()
        proc.wait()


def test_watcher_config_lists_members_leader_first_out_and_carries_the_setting(monkeypatch):
    monkeypatch.setenv(autostop.INTERVAL_ENV, "2")
    config = autostop.watcher_config(_cluster(), autostop.Setting(90, True, "jobs-and-ssh"), "poweroff", now=5.0)
    assert config["members"] == [{"name": "node-2", "address": "10.0.0.2"}, {"name": "node-3", "address": "10.0.0.3"}]
    assert (config["idle_s"], config["down"], config["wait_for"], config["interval_s"], config["set_at"]) == (
        90, True, "jobs-and-ssh", 2, 5.0)
    cancelled = autostop.watcher_config(_cluster(), None, "poweroff")
    assert cancelled["idle_s"] is None and cancelled["down"] is False


def test_install_script_carries_program_and_config_quoted():
    script = autostop.install_script({"cluster": "c", "idle_s": 60, "poweroff": "kill -TERM \"$(cat x)\""})
    assert script.startswith("#!/bin/sh\n# inputs, set by clustertool:\nMODE=install\n")
    assert "PROGRAM_B64=" in script and "CONFIG_B64=" in script and "kill -TERM" not in script


def test_show_output_parses_config_state_poweroff_and_log():
    text = ('config {"idle_s": 60}\nstate {"idle_since": 100, "busy": []}\npoweroff {}\n'
            "log 2026-01-01T00:00:00Z idle\n")
    view = autostop.parse_show(text)
    assert view.config == {"idle_s": 60} and view.idle_for(now=130) == 30 and view.log == ["2026-01-01T00:00:00Z idle"]


def test_status_lines_say_the_setting_and_the_idle_time():
    c = _cluster()
    assert autostop.status_lines(c, None) == {"autostop": "off"}
    c.autostop = {"idle_s": 1800, "down": False, "wait_for": "jobs"}
    view = autostop.WatcherView(state={"idle_since": 1000.0})
    assert autostop.status_lines(c, view, now=1300) == {
        "autostop": "stop every node after 30m idle (counting jobs and GPU use)", "idle": "5m so far (stops at 30m)"}
    busy = autostop.WatcherView(state={"idle_since": None, "busy": ["job(s) running: j1"]})
    assert autostop.status_lines(c, busy)["idle"] == "0s: job(s) running: j1"


@pytest.mark.parametrize("states,down,event", [
    (["stopped", "stopped", "stopped"], False, "autostop"), (["stopped"] * 3, True, "autodown"),
    (["terminated", "terminated", "missing"], False, "autodown"), (["stopped", "stopped", "running"], False, None)])
def test_powered_off_tells_autostop_from_autodown_and_waits_for_every_node(states, down, event):
    c = _cluster()
    c.autostop = {"idle_s": 60, "down": down}
    queried = [Node(name=f"node-{i}", index=i, address="", state=s) for i, s in enumerate(states, 1)]
    assert autostop.powered_off(c, queried) == event
    c.autostop = None
    assert autostop.powered_off(c, queried) is None  # stopped outside clustertool: not ours to name


def test_launch_shutdown_behaviour_follows_autodown_and_spot():
    assert az_launch.shutdown_behavior({}) == "stop"
    assert az_launch.shutdown_behavior({}, {"idle_s": 60, "down": False}) == "stop"
    assert az_launch.shutdown_behavior({}, {"idle_s": 60, "down": True}) == "terminate"
    assert az_launch.shutdown_behavior({"spot": True}) == "terminate"


def test_spec_reads_autostop_keys_and_refuses_autodown_alone(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes: 2\nautostop: 1h\nautodown: true\nwait_for: jobs-and-ssh\n")
    assert spec.load_spec(str(path)).autostop == {"idle_s": 3600, "down": True, "wait_for": "jobs-and-ssh"}
    assert spec.load_spec(None, {"name": "c", "nodes": 2}).autostop is None
    with pytest.raises(SpecError, match="--autodown: needs --autostop"):
        spec.load_spec(None, {"name": "c", "nodes": 2, "autodown": True})
    with pytest.raises(SpecError, match="--autostop: expected an idle time"):
        spec.load_spec(None, {"name": "c", "nodes": 2, "autostop": "soon"})
    with pytest.raises(SpecError, match="--wait-for: expected jobs or jobs-and-ssh"):
        spec.load_spec(None, {"name": "c", "nodes": 2, "autostop": "5m", "wait_for": "forever"})


def test_the_watcher_tick_is_a_no_op_without_config(tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "DIR", str(tmp_path))
    assert watcher.tick() is None
    (tmp_path / "config.json").write_text(json.dumps({"idle_s": None}))
    assert watcher.tick(now=50.0) is None
    assert json.loads((tmp_path / "state.json").read_text())["cancelled"] is True


def test_a_local_node_powers_off_by_ending_its_own_sshd_never_by_shutdown():
    from clustertool.providers.local.local_provider import LocalProvider

    command = autostop.poweroff_command(LocalProvider())
    assert command == 'kill -TERM "$(cat /etc/ssh/sshd.pid)"'  # the node's own /etc/ssh, its init then exits
    assert "shutdown" not in command  # /run is the host's: a shutdown there would reach the host's init
    from clustertool.providers.base import Provider

    assert Provider.POWEROFF is None   # a provider that declares no command of its own gets shutdown -h
    assert autostop.poweroff_command(Provider()) == autostop.DEFAULT_POWEROFF
