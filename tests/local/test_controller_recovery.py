"""Issue 35's local test: a cluster made with `up --controller`, a detached job `--restarts 1 --replace-failed`,
a node's namespace killed, and nothing else run by the test (no `recover`, no `--follow`): the cluster's
controller (a detached process on this machine) replaces the node, the job succeeds with
CLUSTERTOOL_RESTART_COUNT=1, and `jobs` names the controller as the replacer.  `status` shows the controller;
`down` stops it first (before the nodes go) and leaves no process.

Real parts: sshd nodes in network namespaces, Open MPI, the local provider's `replace`, the controller process.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import run_cli, unique
from tests.local.conftest import controllers, local_leftovers

pytestmark = pytest.mark.local

# attempt 0 waits (the node dies under it); attempt 1 ends at once
TORCH_SCRIPT = """
import os, time
count = int(os.environ["CLUSTERTOOL_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} count={count} master={os.environ['MASTER_ADDR']}", flush=True)
if count == 0:
    time.sleep(600)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()} sum={int(total.item())}", flush=True)
dist.destroy_process_group()
"""
SCRIPT = ('echo "count=$CLUSTERTOOL_RESTART_COUNT ckpt=$CLUSTERTOOL_CHECKPOINT_DIR"; '
          '[ "$CLUSTERTOOL_RESTART_COUNT" = 0 ] && exec sleep 600; exit 0')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ctlrec")
    env = dict(os.environ, CLUSTERTOOL_HOME=str(tmp / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp / "hf"),
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    name = unique("cr")
    up = run_cli("up", "--provider", "local", "--nodes", "3", "--name", name, "--slots", "1", "--controller", env=env)
    assert up.returncode == 0, up.stderr
    assert "controller: running on this machine (pid" in up.stderr, up.stderr
    outcome: dict = {}
    yield name, env, outcome
    (pid,) = controllers(name)
    down = run_cli("down", "-c", name, "--yes", env=env)
    outcome["down"] = down
    assert down.returncode == 0, down.stderr
    first = down.stderr.splitlines()[0]
    assert first.endswith(f"controller of {name}: stopped (pid {pid})"), down.stderr  # first, before the nodes go
    assert controllers(name) == [], "down left the controller running"
    assert local_leftovers(name) == [], f"cluster {name} left things behind"


def wait_for(what, check, timeout: float = 240.0, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s"
        time.sleep(poll)


def job_of(name: str, env: dict, job_id: str) -> dict:
    listed = run_cli("jobs", "-c", name, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    return next(j for j in json.loads(listed.stdout)["jobs"] if j["id"] == job_id)


def ended(name: str, env: dict, job_id: str) -> dict | None:
    """The job's record once it ended (a leader that does not answer for a while is not an end)."""
    job = job_of(name, env, job_id)
    return job if job["state"] in ("succeeded", "failed", "killed") else None


def test_status_shows_the_controller_running_on_this_machine(cluster):
    name, env, _ = cluster
    (pid,) = controllers(name)
    shown = run_cli("status", "-c", name, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["controller"].startswith(f"running (pid {pid})")
    text = run_cli("status", "-c", name, env=env).stdout
    assert f"controller: running (pid {pid})" in text


def test_the_controller_replaces_a_killed_node_and_the_detached_job_succeeds_with_no_recover(cluster):
    name, env, _ = cluster
    started = run_cli("run", "-c", name, "--restarts", "1", "--replace-failed", "--replace-wait", "4m",
                      "--checkpoint-dir", "/scratch/ckpt", "--no-tag-output", "--", "sh", "-c", SCRIPT, env=env)
    assert started.returncode == 0, started.stderr
    assert "the cluster's controller replaces it (no `clustertool recover` needed)" in started.stderr
    assert ("warning: --checkpoint-dir /scratch/ckpt is not on a shared filesystem (the cluster has no shared "
            "filesystem (`up --shared-fs`)): the leader's copy dies with it") in started.stderr, started.stderr
    job_id = started.stdout.strip().splitlines()[-1]

    def every_rank_started() -> bool:
        logs = run_cli("logs", "-c", name, job_id, env=env).stdout
        return logs.count("count=0") == 3

    wait_for("start of every rank", every_rank_started)
    ns = net.netns_name(name, 3)
    old = sysops.pids_in_netns([ns])[ns]
    sysops.kill_all(old)  # node-3 dies: sshd, orted and its rank; nothing else is run by this test

    job = wait_for("end of the job", lambda: ended(name, env, job_id), timeout=360, poll=2.0)
    assert job["state"] == "succeeded" and job["exit_code"] == 0, job
    first, second = job["attempts"]
    assert first["cause"] == "node-3 lost" and first["replaced"]["nodes"] == ["node-3"]
    assert first["replaced"]["by"].startswith("the controller on "), first
    assert second["restart_count"] == 1 and second["code"] == 0
    logs = run_cli("logs", "-c", name, job_id, "--attempt", "2", env=env).stdout
    assert logs.count("count=1 ckpt=/scratch/ckpt") == 3, logs  # every rank of the new attempt, new node-3 too
    table = run_cli("jobs", "-c", name, env=env).stdout
    assert "node-3 lost; node-3 replaced by the controller on " in table, table
    assert not any(sysops.alive(p) for p in old)
    shown = json.loads(run_cli("status", "-c", name, "--json", env=env).stdout)
    assert {n["node"]: n["reachable"] for n in shown["nodes"]} == {"node-1": True, "node-2": True, "node-3": True}
    assert shown["controller"].startswith("running (pid ")


@pytest.fixture
def torch_script():
    pytest.importorskip("torch", reason="PyTorch (CPU) is installed by `make venv`; NO_TORCH=1 skips it")
    folder = Path("/var/tmp") / f"ct-test-ctlrec-{uuid.uuid4().hex[:8]}"  # every local node sees /var/tmp
    folder.mkdir()
    (folder / "train.py").write_text(TORCH_SCRIPT)
    yield folder / "train.py"
    shutil.rmtree(folder)


def test_the_controller_replaces_a_killed_leader_and_a_torchrun_job_starts_again_there(cluster, torch_script):
    """The leader dies with the job's restart loop: the controller (this machine) finds it silent, replaces it and
    plans the job again from its kept request (new hostfile, MASTER_ADDR, the agent on every node: the new
    leader's disk is empty); the next attempt's ranks meet at the new leader (gloo all_reduce of 3 ranks)."""
    name, env, _ = cluster
    before = {n["node"]: n["host_key"] for n in json.loads(run_cli("status", "-c", name, "--json", env=env).stdout)[
        "nodes"]}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    started = run_cli("run", "-c", name, "--restarts", "1", "--replace-failed", "--replace-wait", "4m",
                      "--no-tag-output", "--", torchrun, str(torch_script), env=env)
    assert started.returncode == 0, started.stderr
    assert "a lost leader restarts this job from step 0 unless its checkpoints are on shared storage" in started.stderr
    job_id = started.stdout.strip().splitlines()[-1]
    assert job_of(name, env, job_id)["launcher"] == "torchrun"
    wait_for("start of every rank", lambda: run_cli("logs", "-c", name, job_id, env=env).stdout.count("count=0") == 3)
    ns = net.netns_name(name, 1)
    old = sysops.pids_in_netns([ns])[ns]
    sysops.kill_all(old)  # the leader dies: mpirun, the restart loop, its agent and rank; nothing else run here

    job = wait_for("end of the job", lambda: ended(name, env, job_id), timeout=420, poll=2.0)
    assert job["state"] == "succeeded" and job["exit_code"] == 0, job
    assert [a["cause"] for a in job["attempts"]] == ["node-1 lost (the leader)", None]
    assert job["attempts"][1]["restart_count"] == 1
    logs = run_cli("logs", "-c", name, job_id, "--attempt", "2", env=env).stdout
    assert logs.count("count=1") == 3 and logs.count("sum=3") == 3, logs  # the three ranks met again
    log = (Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "controller.log").read_text()
    assert f"the leader was replaced; started again there: {job_id}" in log, log[-3000:]
    now = {n["node"]: n for n in json.loads(run_cli("status", "-c", name, "--json", env=env).stdout)["nodes"]}
    assert now["node-1"]["host_key"] not in (None, before["node-1"]) and now["node-1"]["reachable"]
    assert not any(sysops.alive(p) for p in old)
