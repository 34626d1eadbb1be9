"""run --replace-failed on the leader's side: the restart decision, the restart loop waiting for the
recovery loop's `replaced` mark (run by launch.sh here with a scratch HOME and a stand-in mpirun that runs
the command as one rank, as in test_restarts), a replacement with a new address, and bad options."""

from __future__ import annotations

import json
import socket
import time

import pytest

from clustertool import nodeprogs
from clustertool.jobs import scripts
from clustertool.nodeprogs import restarts
from tests.unit.test_jobs_scripts import new_id, sh, wait_for
from tests.unit.test_restarts import failed, fake_mpirun

pytestmark = pytest.mark.unit


def test_a_lost_node_with_replace_failed_restarts_once_replaced_and_a_spot_node_never_succeeds():
    assert restarts.decide(failed(143), 2, None, lost="node-3", replace_failed=True) == (
        True, "restart 1 of 2 once node-3 is replaced")
    again, why = restarts.decide(failed(143, 143), 1, None, lost="node-3", replace_failed=True)
    assert not again and why == "node-3 lost and every restart used (--restarts 1): giving up"
    # ranks that checkpointed and exited 0 on a spot notice did not finish the job
    again, why = restarts.decide(failed(0), 2, None, lost="node-2", replace_failed=False,
                                 what="had a spot interruption notice")
    assert not again and why.startswith("node-2 had a spot interruption notice: no restart without it")
    assert "--replace-failed" in why
    assert restarts.decide(failed(0), 2, None, lost="node-2", replace_failed=True)[0]
    assert restarts.decide(failed(143), 2, [137], lost="node-2", replace_failed=True)[0]  # codes: not for a loss
    assert not restarts.decide(failed(143), 2, None, killed=True, lost="node-2", replace_failed=True)[0]


@pytest.fixture
def listening():
    """A port that takes connections: the lost node's sshd, answering again after the replacement."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


# Attempt 0: the node is lost (the supervisor's `lost` record) and the rank fails; attempt 1 succeeds.
LOSE_ONCE = ('d="$HOME/.clustertool/jobs/$CLUSTERTOOL_JOB"; echo "count=$CLUSTERTOOL_RESTART_COUNT"; '
             '[ "$CLUSTERTOOL_RESTART_COUNT" = 0 ] || exit 0; '
             'echo \'{"node": "node-3", "what": "stopped answering", "nodes": ["node-3"]}\' > "$d/lost"; exit 143')


def start(tmp_path, port, wait_s):
    job_id = new_id()
    d = tmp_path / ".clustertool/jobs" / job_id
    out = f"{d}/out"
    argv = [fake_mpirun(tmp_path), "--output-filename", f"{out}:nocopy", "sh", "-c", LOSE_ONCE]
    program = nodeprogs.program_text("restarts", {"job_dir": str(d), "argv": argv, "out": out, "restarts": 2,
                                                  "codes": None, "nodes": [["node-3", "127.0.0.1", port]],
                                                  "replace_failed": True, "replace_wait": wait_s})
    launch_sh = scripts.launch_script(job_id, argv, str(tmp_path), restarts=True)
    sh(scripts.install_and_start_script(job_id, launch_sh, "10.0.0.1 slots=1\n10.0.0.3 slots=1\n", "{}",
                                        prefer_tmux=False, restarter=program), tmp_path, check=True)
    return job_id, d


def _waiting(d):
    try:
        return json.loads((d / "attempts.json").read_text()).get("waiting")
    except (OSError, ValueError):
        return None


def test_the_leader_waits_for_the_replacement_then_restarts_with_the_same_job_id(tmp_path, listening):
    job_id, d = start(tmp_path, listening, 60)
    deadline = time.monotonic() + 30

    def said() -> bool:  # attempts.json's wait and the log's lines are two writes: both, before looking
        return _waiting(d) is not None and "waiting up to" in ((d / "log").read_text() if (d / "log").exists() else "")

    while not said() and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = _waiting(d)
    assert waiting["nodes"] == ["node-3"] and waiting["attempt"] == 1 and waiting["until"] > time.time()
    assert not (d / "exit").exists()  # the job is still on: it waits
    log = (d / "log").read_text()
    assert "attempt 1 ended: node-3 lost; restart 1 of 2 once node-3 is replaced" in log
    assert "waiting up to 1m00s for node-3 to be replaced" in log
    (d / "replaced").write_text(json.dumps({"attempt": 1, "nodes": {"node-3": ["127.0.0.1", listening]}}))
    assert wait_for(d / "exit", timeout=30)
    assert (d / "exit").read_text().strip() == "0"
    doc = json.loads((d / "attempts.json").read_text())
    assert [(a["code"], a["cause"]) for a in doc["attempts"]] == [(143, "node-3 lost"), (0, None)]
    assert doc["attempts"][0]["replaced"]["nodes"] == ["node-3"] and doc["waiting"] is None
    assert doc["verdict"] == "succeeded on attempt 2"
    assert (d / "out/attempt.1/1/rank.0/stdout").read_text() == "count=1\n"  # same job id, next count
    assert (d / "attempts/0/lost").exists() and (d / "replaced.1").exists()


def test_nobody_replacing_within_the_wait_stops_the_job_and_says_why(tmp_path, listening):
    _, d = start(tmp_path, listening, 1)
    assert wait_for(d / "exit", timeout=30)
    assert (d / "exit").read_text().strip() == "143"
    doc = json.loads((d / "attempts.json").read_text())
    assert len(doc["attempts"]) == 1 and doc["verdict"].startswith("node-3 not replaced within 1s (--replace-wait)")
    assert "`clustertool recover`" in doc["verdict"]


def test_a_replaced_node_with_a_new_address_is_followed_in_the_hostfile_argv_and_supervisor(tmp_path):
    (tmp_path / "hostfile").write_text("10.0.0.1 slots=1\n10.0.0.3 slots=1\n10.0.0.30 slots=1\n")
    (tmp_path / "supervise.py").write_text('ARGS = {"nodes": [["node-3", "10.0.0.3", 22], '
                                           '["node-4", "10.0.0.30", 22]]}')
    args = {"nodes": [["node-3", "10.0.0.3", 22], ["node-4", "10.0.0.30", 22]],
            "argv": ["mpirun", "-x", "A=10.0.0.3", "-H", "10.0.0.3:1,10.0.0.30:1"]}
    restarts.readdress(args, str(tmp_path), {"nodes": {"node-3": ["10.0.0.9", 22]}})
    assert (tmp_path / "hostfile").read_text() == "10.0.0.1 slots=1\n10.0.0.9 slots=1\n10.0.0.30 slots=1\n"
    assert args["argv"] == ["mpirun", "-x", "A=10.0.0.9", "-H", "10.0.0.9:1,10.0.0.30:1"]
    assert args["nodes"][0] == ["node-3", "10.0.0.9", 22] and args["nodes"][1][1] == "10.0.0.30"
    assert '"10.0.0.9"' in (tmp_path / "supervise.py").read_text()


def test_one_loop_claims_a_relaunch_and_the_launch_files_kept_here_are_private(ct_env):
    import stat

    from clustertool.core.model import JobRecord
    from clustertool.jobs import recovery

    job = JobRecord(id="j1126-aaaaaa", cluster="c1", command=["x"], replace_failed=True,
                    attempts=[{"attempt": 1}])
    recovery.keep_launch(job, "echo start\n")
    path = recovery._launch_path(job)
    assert path.read_text() == "echo start\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert recovery._claim(job) is True and recovery._claim(job) is False  # a second loop leaves it to the first
    job.attempts.append({"attempt": 2})
    assert recovery._claim(job) is True  # the next attempt's loss is a new claim
    recovery.keep_launch(JobRecord(id="j1126-bbbbbb", cluster="c1", command=["x"]), "x")
    assert not recovery._launch_path(JobRecord(id="j1126-bbbbbb", cluster="c1", command=["x"])).exists()
