"""The end of a block, on a real local cluster: the leader's watcher signals a running job's ranks
before the machines go, on every node, once, and `jobs`/`status` say so.

The end is set with `clustertool capacity block-end --at +60s` (the same record and watcher config
that `up --capacity-block` writes from the block's end time), the warning window is 54 s, so the
ranks are due their signal about 6 s later by the real clock; nothing here moves the clock.  The
sampling interval is the hidden knob ``CLUSTERTOOL_AUTOSTOP_INTERVAL`` (1 s instead of a minute).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.local
NODES = 3
# each rank traps the signal, leaves a file in its node's home and ends cleanly (a checkpoint, in life)
JOB = ('trap \'echo "rank $RANK got TERM"; date +%s.%N > "$HOME/blockend-$RANK"; exit 0\' TERM; '
       'while :; do sleep 0.2; done')


def _home(env: dict, name: str, node: str) -> Path:
    return Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "local" / node / "home"


def _until(what, limit: float, why):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(why())


def test_the_block_end_warning_signals_every_rank_of_a_running_job_once_and_jobs_and_status_show_it(
        local_cluster, ct_env):
    env = dict(ct_env, CLUSTERTOOL_AUTOSTOP_INTERVAL="1")
    name = local_cluster(NODES, env=env)
    job = run_cli("run", "-c", name, "--json", "--", "sh", "-c", JOB, env=env)
    assert job.returncode == 0, job.stderr
    job_id = json.loads(job.stdout)["id"]
    log = _home(env, name, "node-1") / ".clustertool" / "autostop" / "autostop.log"

    bad = run_cli("capacity", "block-end", "-c", name, "--at", "soon", env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: invalid --at 'soon'"), bad.stderr
    set_ = run_cli("capacity", "block-end", "-c", name, "--at", "+60s", "--block-end-warning", "54s", "--json",
                   env=env)
    assert set_.returncode == 0, set_.stderr
    warn_at = json.loads(set_.stdout)["warn_at"]
    assert json.loads(set_.stdout)["block_end"]["signal"] == "TERM"
    files = [_home(env, name, f"node-{i + 1}") / f"blockend-{i}" for i in range(NODES)]  # rank i on node-(i+1)

    got = _until(lambda: all(f.exists() for f in files), 40,
                 lambda: f"not every rank got the signal: {[f.exists() for f in files]}; log: "
                         f"{log.read_text() if log.exists() else '(none)'}")
    assert got
    stamps = [float(f.read_text()) for f in files]
    assert min(stamps) >= warn_at - 1.0, (stamps, warn_at)  # not before the warning time (1 s: clock reading)
    text = log.read_text()
    assert text.count(f"block end: signalled TERM to job {job_id} ({NODES} rank(s)") == 1, text

    def finished():
        listed = run_cli("jobs", "-c", name, "--json", env=env)
        [mine] = [j for j in json.loads(listed.stdout)["jobs"] if j["id"] == job_id]
        return mine if mine["state"] != "running" else None

    done = _until(finished, 30, lambda: "the job did not end after its ranks were signalled")
    assert done["state"] == "succeeded"  # every rank trapped TERM and exited 0
    assert done["block_end_signal"]["signal"] == "TERM"
    assert sum(len(p) for p in done["block_end_signal"]["ranks"].values()) == NODES
    shown = run_cli("jobs", "-c", name, env=env)
    assert f"job {job_id}: signalled TERM at " in shown.stdout and f"({NODES} rank(s))" in shown.stdout
    status = run_cli("status", "-c", name, env=env)
    assert status.returncode == 0, status.stderr
    assert "block end: an end set by `clustertool capacity block-end` (+60s)" in status.stdout
    assert "running jobs get SIGTERM 54s before" in status.stdout
    assert f"block end warned: job {job_id}: signalled TERM" in status.stdout
