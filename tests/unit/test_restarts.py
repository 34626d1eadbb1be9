"""run --restarts: the restart decision (nodeprogs/restarts.py), each attempt's argv and output folder, the
loop itself run by launch.sh here with a scratch HOME (a stand-in mpirun that runs the command as one rank:
the loop, its files and its lines are the real ones), `logs` reading attempts apart, and bad options."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from clustertool import nodeprogs
from clustertool.core.errors import UsageError
from clustertool.jobs import records, scripts
from clustertool.jobs.failure import last_attempt
from clustertool.jobs.jobrequests import RestartPolicy, parse_exit_codes
from clustertool.nodeprogs import restarts
from tests.unit.test_jobs_scripts import new_id, sh, wait_for

pytestmark = pytest.mark.unit


def failed(*codes, kind="exit"):
    return [{"code": c, "kind": kind} for c in codes]


def test_a_failure_restarts_until_the_restarts_are_used_and_the_same_code_is_named():
    assert restarts.decide(failed(137), 2, None) == (True, "restart 1 of 2")
    assert restarts.decide(failed(137, 137), 2, None) == (True, "restart 2 of 2")
    again, why = restarts.decide(failed(137, 137, 137), 2, None)
    assert not again and why == "failed with exit code 137 3 times (--restarts 2): giving up"
    again, why = restarts.decide(failed(137, 1, 137), 2, None)
    assert not again and "every restart used" in why


def test_only_the_listed_exit_codes_restart():
    assert restarts.decide(failed(137), 2, [137])[0]
    again, why = restarts.decide(failed(1), 2, [137])
    assert not again and why == "exit code 1 is not in --restart-on-exit-codes 137: no restart"
    assert restarts.decide(failed(143, kind="hung"), 2, [137])[0]  # a hang stopped by --hang-action kill


def test_success_kill_and_a_lost_node_stop_the_loop():
    assert restarts.decide(failed(137, 0), 2, None) == (False, "succeeded on attempt 2")
    assert restarts.decide(failed(0), 2, None) == (False, "succeeded")
    again, why = restarts.decide(failed(143), 2, None, killed=True)
    assert not again and "kill" in why
    again, why = restarts.decide(failed(143, kind="lost"), 2, None, lost="node-3")
    assert not again and "node-3 stopped answering" in why and "cordon node-3" in why


def test_a_job_warned_of_its_capacity_block_end_is_not_restarted():
    again, why = restarts.decide(failed(143), 2, None, block_end=True)
    assert not again and why == "the capacity block ends (the job was warned): no restart"
    assert restarts.decide(failed(0), 2, None, block_end=True) == (False, "succeeded")


def test_each_attempt_forwards_the_restart_count_and_writes_its_own_output_folder():
    argv = ["mpirun", "-np", "2", "--output-filename", "/h/j/out:nocopy", "python", "t.py"]
    assert restarts.attempt_argv(argv, "/h/j/out", 0) == [
        "mpirun", "-x", "CLUSTERTOOL_RESTART_COUNT", "-x", "TORCHELASTIC_RESTART_COUNT", "-np", "2",
        "--output-filename", "/h/j/out:nocopy", "python", "t.py"]
    assert "/h/j/out/attempt.2:nocopy" in restarts.attempt_argv(argv, "/h/j/out", 2)
    assert restarts.exit_code(-9) == 137 and restarts.exit_code(1) == 1


def test_bad_restart_options_are_one_clear_line():
    with pytest.raises(UsageError, match="goes with --restarts"):
        RestartPolicy(0, (137,))
    with pytest.raises(UsageError, match="not an exit code"):
        RestartPolicy(2, (0,))
    with pytest.raises(UsageError, match="0 or more"):
        RestartPolicy(-1, None)
    with pytest.raises(UsageError, match="separated by commas"):
        parse_exit_codes("1;137")
    assert parse_exit_codes("137, 1") == [137, 1] and RestartPolicy(2, (137, 1, 1)) == RestartPolicy(2, (1, 137))


def fake_mpirun(tmp_path):
    """Runs the command after mpirun's options as one rank (drops `-x NAME` pairs); writes its output to
    OUT/1/rank.0/stdout as `--output-filename OUT:nocopy` does."""
    path = tmp_path / "mpirun"
    path.write_text(f"#!{sys.executable}\n" + """import os, subprocess, sys
a = sys.argv[1:]
out = None
while a and a[0].startswith("-"):
    if a[0] == "--output-filename":
        out = a[1].split(":")[0]
    a = a[2:]
os.makedirs(f"{out}/1/rank.0", exist_ok=True)
fh = open(f"{out}/1/rank.0/stdout", "ab")
sys.exit(subprocess.call(a, stdout=fh))
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def start_loop(tmp_path, script, n, codes=None, nodes=()):
    job_id = new_id()
    d = tmp_path / ".clustertool/jobs" / job_id
    out = f"{d}/out"
    argv = [fake_mpirun(tmp_path), "--output-filename", f"{out}:nocopy", "sh", "-c", script]
    program = nodeprogs.program_text("restarts", {"job_dir": str(d), "argv": argv, "out": out, "restarts": n,
                                                  "codes": codes, "nodes": list(nodes)})
    launch_sh = scripts.launch_script(job_id, argv, str(tmp_path), restarts=True)
    sh(scripts.install_and_start_script(job_id, launch_sh, "", "{}", prefer_tmux=False, restarter=program),
       tmp_path, check=True)
    assert wait_for(d / "exit", timeout=30)
    return job_id, d


def test_the_loop_restarts_with_the_count_in_the_environment_and_keeps_attempts_apart(tmp_path):
    script = 'echo "count=$CLUSTERTOOL_RESTART_COUNT torch=$TORCHELASTIC_RESTART_COUNT"; ' \
             '[ "$CLUSTERTOOL_RESTART_COUNT" = 1 ] || exit 137'
    job_id, d = start_loop(tmp_path, script, 2, [137])
    assert (d / "exit").read_text().strip() == "0"
    assert (d / "out/1/rank.0/stdout").read_text() == "count=0 torch=0\n"
    assert (d / "out/attempt.1/1/rank.0/stdout").read_text() == "count=1 torch=1\n"
    doc = records.parse_attempts(sh(scripts.status_script(), tmp_path, check=True).stdout)[job_id]
    assert [(a["attempt"], a["code"], a["cause"]) for a in doc["attempts"]] == [(1, 137, "exit code 137 (signal 9)"),
                                                                                 (2, 0, None)]
    assert doc["verdict"] == "succeeded on attempt 2"
    log = (d / "log").read_text()
    assert "attempt 1 ended: exit code 137 (signal 9); restart 1 of 2" in log
    assert last_attempt(log).startswith("clustertool: attempt 2 of up to 3 starting")
    lines = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("ranklog", {
        "out": str(d / "out"), "log": None, "ranks": None, "tag": True, "mode": "read", "tail": None,
        "final": True, "end": {}, "keys": False}), capture_output=True, check=True).stdout.decode().splitlines()
    assert lines == ["[1,0]<stdout>:count=0 torch=0", "[2,0]<stdout>:count=1 torch=1"]


def test_the_loop_stops_on_a_code_not_listed_and_after_n_same_failures(tmp_path):
    _, d = start_loop(tmp_path, '[ "$CLUSTERTOOL_RESTART_COUNT" = 0 ] && exit 137; exit 1', 3, [137])
    assert (d / "exit").read_text().strip() == "1"
    doc = json.loads((d / "attempts.json").read_text())
    assert [a["code"] for a in doc["attempts"]] == [137, 1] and "not in --restart-on-exit-codes" in doc["verdict"]
    _, d = start_loop(tmp_path, "exit 3", 1)
    doc = json.loads((d / "attempts.json").read_text())
    assert (d / "exit").read_text().strip() == "3" and len(doc["attempts"]) == 2
    assert "failed with exit code 3 2 times (--restarts 1): giving up" in (d / "log").read_text()


def test_a_node_that_does_not_answer_after_a_failure_stops_the_restarts_and_is_named(tmp_path):
    with socket.socket() as s:  # a port nothing listens on once closed: the node's sshd is gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, d = start_loop(tmp_path, "exit 1", 2, nodes=[["node-2", "127.0.0.1", port]])
    doc = json.loads((d / "attempts.json").read_text())
    assert len(doc["attempts"]) == 1 and doc["attempts"][0]["cause"] == "node-2 lost"
    assert doc["verdict"].startswith("node-2 stopped answering: no restart without it")


def test_a_node_agent_sets_the_last_attempts_failure_aside_and_writes_to_the_attempts_folder(tmp_path, monkeypatch):
    from clustertool.nodeprogs import jobagent

    monkeypatch.setattr(jobagent, "job_dir", lambda: str(tmp_path))
    (tmp_path / "failure").write_text("{}")
    (tmp_path / "exits").mkdir()
    (tmp_path / "exits" / f"{jobagent.host()}.0").write_text("{}")
    assert jobagent.begin_attempt("/o", 2) == "/o/attempt.2"
    assert (tmp_path / "attempts/1/failure").exists() and not (tmp_path / "failure").exists()
    assert os.listdir(tmp_path / "exits") == []


def test_a_playbook_run_step_takes_restarts_and_restart_on_exit_codes():
    from clustertool.cli.play import resolver
    from clustertool.core import yamlfile
    from clustertool.playbook import load

    text = "steps:\n  - run: {restarts: 2, restart_on_exit_codes: '1,137', command: [python3, t.py]}\n"
    argv = load.parse(yamlfile.loads(text), "pb.yaml", {}, resolver, {}).steps[0].argv
    assert argv[argv.index("--restarts") + 1] == "2" and argv[argv.index("--restart-on-exit-codes") + 1] == "1,137"
