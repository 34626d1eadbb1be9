"""`clustertool stacks` on a real job: a 2-node x 2-slot local cluster (sshd in namespaces, Open MPI),
a python script whose rank 1 sleeps in `stuck_here()` while the others sleep in `waiting()`, and
the real py-spy (the test extra) on the nodes.  The stacks fold into two groups, rank 1 alone;
with --no-py-spy every rank shows what /proc says and which method that was."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from clustertool.jobs.stacks import local_py_spy
from clustertool.workloads import node_python
from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local

SCRIPT = '''import os
import time


def stuck_here():
    time.sleep(300)


def waiting():
    time.sleep(300)


if os.environ["RANK"] == "1":
    stuck_here()
else:
    waiting()
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 2, "sk", "--slots", "2")


@pytest.fixture(scope="module")
def job(cluster):
    name, env = cluster
    folder = Path("/var/tmp") / f"ct-test-stacks-{uuid.uuid4().hex[:8]}"   # every local node sees /var/tmp
    folder.mkdir()
    (folder / "hang.py").write_text(SCRIPT)
    started = run_cli("run", "-c", name, "--", *node_python(), str(folder / "hang.py"), env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    yield job_id
    killed = run_cli("kill", "-c", name, job_id, "--grace", "2", env=env, timeout=120)
    shutil.rmtree(folder)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    ended = run_cli("stacks", "-c", name, job_id, env=env, timeout=120)   # a job that has ended: one line
    assert ended.returncode != 0 and ended.stdout == ""
    assert ended.stderr.startswith(f"error: job {job_id} is not running: it was killed"), ended.stderr


def stacks_until(cluster, job_id: str, *flags: str, ready, timeout: float = 30.0):
    """`stacks --json` again until ``ready(doc)`` (ranks need a moment to reach their function)."""
    name, env = cluster
    deadline = time.monotonic() + timeout
    while True:
        proc = run_cli("stacks", "-c", name, job_id, "--json", *flags, env=env, timeout=120)
        doc = json.loads(proc.stdout) if proc.returncode == 0 else None
        if (doc is not None and ready(doc)) or time.monotonic() > deadline:
            assert doc is not None, proc.stdout + proc.stderr
            return doc
        time.sleep(1)


@pytest.mark.skipif(not local_py_spy(), reason="py-spy is installed by `make setup` (the test extra)")
def test_stacks_fold_the_ranks_and_rank_1_stands_alone_in_stuck_here(cluster, job):
    name, env = cluster
    doc = stacks_until(cluster, job, ready=lambda d: len(d["ranks"]) == 4 and len(d["groups"]) == 2)
    assert {r["method"] for r in doc["ranks"]} == {"py-spy"}, doc["ranks"]
    assert [g["ranks"] for g in doc["groups"]] == [[0, 2, 3], [1]]
    assert doc["ranks"][1]["frames"][0]["function"] == "stuck_here"
    proc = run_cli("stacks", "-c", name, job, env=env, timeout=120)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    # the Python stacks' groups; the Flight Recorder's lines follow them (here: mpirun's ranks have no hook, said)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("Flight Recorder")]
    assert len(lines) == 2, proc.stdout
    assert "Flight Recorder: ranks 0-3 (node-[1-2]): no Flight Recorder hook" in proc.stdout
    assert lines[0] == "ranks 0,2-3 (node-[1-2]): waiting (hang.py:10) ← hang.py:16"
    assert lines[1] == "rank 1 (node-1): stuck_here (hang.py:6) ← hang.py:14"


def test_without_py_spy_every_rank_says_what_proc_sees_and_which_method(cluster, job):
    name, env = cluster
    stacks_until(cluster, job, "--no-py-spy", ready=lambda d: len(d["ranks"]) == 4)
    proc = run_cli("stacks", "-c", name, job, "--no-py-spy", env=env, timeout=120)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ranks 0-3 (node-[1-2]): [/proc; py-spy switched off] state S in "), proc.stdout
    assert "hang.py" in proc.stdout
