"""run --restarts on a real 2-node local cluster with real Open MPI (and torchrun once).

The job's script checkpoints after every step in the rank's own home, on its node's own disk: a restart
runs on the same nodes (a lost node stops the restarts; nothing replaces it here), so each rank finds its
checkpoint where it left it.  The script exits with the code FAIL names for its attempt (FAIL=137,1,0:
attempt 1 exits 137, attempt 2 exits 1, attempt 3 succeeds; "hang": it sleeps), on rank 1 only, so the
job's exit code is that rank's.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster, stop_node_sshd

pytestmark = pytest.mark.local

SCRIPT = r"""
ck="$HOME/ckpt-$CLUSTERTOOL_JOB-$RANK"
step=0; [ -f "$ck" ] && step=$(cat "$ck")
echo "rank $RANK attempt $CLUSTERTOOL_RESTART_COUNT resumed at step $step"
while [ "$step" -lt 3 ]; do step=$((step + 1)); echo "$step" > "$ck"; done
code=$(echo "$FAIL" | cut -d, -f$((CLUSTERTOOL_RESTART_COUNT + 1)))
[ "$code" = hang ] && exec sleep 300
[ "$RANK" = 1 ] && exit "${code:-0}"
exit 0
"""

TORCH_SCRIPT = r"""
import os, sys
print("rank", os.environ["RANK"], "torch count", os.environ.get("TORCHELASTIC_RESTART_COUNT"), flush=True)
sys.exit(137 if os.environ["CLUSTERTOOL_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1" else 0)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 2, "rs", "--slots", "1")


@pytest.fixture(scope="module")
def scripts():
    """The scripts where every node sees them (nodes share the host's /var/tmp, not /tmp)."""
    folder = Path("/var/tmp") / f"ct-test-restarts-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "step.sh").write_text(SCRIPT)
    (folder / "torch_step.py").write_text(TORCH_SCRIPT)
    yield folder
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()


def cli(cluster, *args, timeout=120):
    name, env = cluster
    return run_cli(*args[:1], "-c", name, *args[1:], env=env, timeout=timeout)


def run_job(cluster, scripts, fail, *flags):
    proc = cli(cluster, "run", *flags, "-x", f"FAIL={fail}", "--follow", "--", "sh", str(scripts / "step.sh"))
    job_id = re.search(r"job (j[0-9a-f-]+) started", proc.stderr).group(1)
    return proc, job_id


def record(cluster, job_id):
    proc = cli(cluster, "jobs", "--json")
    assert proc.returncode == 0, proc.stderr
    return next(j for j in json.loads(proc.stdout)["jobs"] if j["id"] == job_id)


def test_a_job_restarts_on_137_resumes_from_its_checkpoint_and_not_on_1(cluster, scripts):
    proc, job_id = run_job(cluster, scripts, "137,1", "--restarts", "2", "--restart-on-exit-codes", "137")
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 attempt 0 resumed at step 0" in proc.stdout
    assert "rank 1 attempt 1 resumed at step 3" in proc.stdout  # its checkpoint, on its own node
    assert "exit code 1 is not in --restart-on-exit-codes 137: no restart" in proc.stdout
    job = record(cluster, job_id)
    assert job["state"] == "failed" and job["exit_code"] == 1
    assert [(a["attempt"], a["code"], a["cause"]) for a in job["attempts"]] == [
        (1, 137, "exit code 137 (signal 9)"), (2, 1, "exit code 1")]
    assert all(a["start"] <= a["end"] for a in job["attempts"])
    logs = cli(cluster, "logs", job_id, "--rank", "1")
    assert re.findall(r"attempt \d+ of 2 .*----", logs.stdout) == [
        "attempt 1 of 2 (CLUSTERTOOL_RESTART_COUNT=0): exit code 137 (signal 9) ----",
        "attempt 2 of 2 (CLUSTERTOOL_RESTART_COUNT=1): exit code 1 ----"]
    second = cli(cluster, "logs", job_id, "--attempt", "2").stdout
    assert "attempt 1 resumed at step 3" in second and "attempt 0 resumed" not in second
    bad = cli(cluster, "logs", job_id, "--attempt", "3")
    assert bad.returncode != 0 and "has no attempt 3" in bad.stderr


def test_a_job_that_keeps_failing_with_the_same_code_stops_after_n_restarts(cluster, scripts):
    proc, job_id = run_job(cluster, scripts, "3,3,3", "--restarts", "1")
    assert proc.returncode == 3
    job = record(cluster, job_id)
    assert [a["code"] for a in job["attempts"]] == [3, 3]
    assert job["restart_verdict"] == "failed with exit code 3 2 times (--restarts 1): giving up"
    table = cli(cluster, "jobs").stdout
    assert "giving up" in table and "1 restart: exit code 3" in table


def test_a_checkpointing_job_succeeds_on_its_second_attempt_and_jobs_shows_the_restart(cluster, scripts):
    proc, job_id = run_job(cluster, scripts, "137,0", "--restarts", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "rank 0 attempt 1 resumed at step 3" in proc.stdout
    job = record(cluster, job_id)
    assert job["state"] == "succeeded" and len(job["attempts"]) == 2
    assert job["attempts"][0]["cause"] == "exit code 137 (signal 9)" and job["attempts"][1]["code"] == 0
    row = next(line for line in cli(cluster, "jobs").stdout.splitlines() if line.startswith(job_id))
    assert "succeeded (1 restart: exit code 137 (signal 9))" in row


def test_kill_ends_a_restartable_job_for_good(cluster, scripts):
    proc = cli(cluster, "run", "--restarts", "3", "-x", "FAIL=137,hang", "--", "sh", str(scripts / "step.sh"))
    job_id = proc.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while len(record(cluster, job_id)["attempts"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(record(cluster, job_id)["attempts"]) == 2
    killed = cli(cluster, "kill", job_id, "--grace", "2")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    job = record(cluster, job_id)
    assert job["state"] == "killed" and len(job["attempts"]) == 2  # the loop died with the job: no attempt 3


def test_torchrun_ranks_get_the_restart_count(cluster, scripts):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if not Path(torchrun).exists():
        pytest.skip("needs torchrun (`make venv`)")
    proc = cli(cluster, "run", "--restarts", "1", "--follow", "--no-tag-output", "--",
               torchrun, str(scripts / "torch_step.py"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(re.findall(r"rank (\d) torch count (\d)", proc.stdout)) == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]


def test_a_lost_node_stops_the_restarts_and_is_named(cluster, scripts):
    """Last in this module: in the local provider a node whose sshd dies is gone (its PID 1 exits)."""
    proc = cli(cluster, "run", "--restarts", "2", "-x", "FAIL=hang", "--", "sh", str(scripts / "step.sh"))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while "attempt 0 resumed" not in cli(cluster, "logs", job_id, "--rank", "1").stdout \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    stop_node_sshd(cluster[0], 2)
    while record(cluster, job_id)["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    job = record(cluster, job_id)
    assert job["state"] == "failed" and [a["cause"] for a in job["attempts"]] == ["node-2 lost"], job
    assert job["restart_verdict"].startswith("node-2 stopped answering: no restart without it")
    assert "cordon node-2" in job["restart_verdict"]
