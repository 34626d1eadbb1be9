"""PyTorch's Flight Recorder on a real local cluster: 4 gloo ranks (2 nodes x 2 slots, `--launcher process`, real
torch), rank 2 never calls the all_reduce the others wait in.  `stacks` names it from the ranks' own records; the
hang check (`--hang-timeout`) saves the same and `jobs` shows it."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from clustertool.workloads import node_python
from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local

SCRIPT = '''import datetime, os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
t = torch.ones(256)
for _ in range(3):
    dist.all_reduce(t)
print("collectives done", flush=True)
if dist.get_rank() == 2:
    time.sleep(900)     # never calls the 4th collective
else:
    dist.all_reduce(t)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("torch", reason="needs torch (the train extra)")
    yield from module_cluster(tmp_path_factory, 2, "fr", "--slots", "2")


def test_stacks_and_the_hang_check_name_the_rank_that_never_called_the_collective(cluster):
    name, env = cluster
    folder = Path("/var/tmp") / f"ct-test-fr-{uuid.uuid4().hex[:8]}"   # every local node sees /var/tmp
    folder.mkdir()
    (folder / "skip.py").write_text(SCRIPT)
    python = node_python()   # ["env", "PYTHONPATH=<this venv>", python]: the path goes by -x (a command that sets
    path = [w for w in python if w.startswith("PYTHONPATH=")]   # PYTHONPATH itself hides the hook's folder)
    command = [w for w in python if w != "env" and not w.startswith("PYTHONPATH=")]
    started = run_cli("run", "-c", name, "--launcher", "process", "--hang-timeout", "20s",
                      *[f for p in path for f in ("-x", p)], "--", *command, str(folder / "skip.py"), env=env,
                      timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    want = "rank 2 (node-2) never called #4: its last collective is #3 (gloo:all_reduce)"
    try:
        deadline = time.monotonic() + 180
        while True:
            proc = run_cli("stacks", "-c", name, job_id, "--json", env=env, timeout=120)
            lines = json.loads(proc.stdout)["flight"] if proc.returncode == 0 else []
            if any(want in line for line in lines):
                break
            assert time.monotonic() < deadline, proc.stdout + proc.stderr
            time.sleep(2)
        assert any("ranks 0-1,3 (node-[1-2]) wait in collective #4 (gloo:all_reduce)" in line for line in lines), lines
        table = run_cli("stacks", "-c", name, job_id, env=env, timeout=120).stdout
        assert "Flight Recorder (gloo, torch 2." in table and want in table
        while True:   # the supervisor's hang check: no output, no CPU for 20 s
            jobs = json.loads(run_cli("jobs", "-c", name, "--json", env=env, timeout=120).stdout)["jobs"]
            mine = next(j for j in jobs if j["id"] == job_id)
            if mine.get("hung_flight"):
                break
            assert time.monotonic() < deadline + 120, mine
            time.sleep(3)
        assert any(want in line for line in mine["hung_flight"]), mine["hung_flight"]
    finally:
        killed = run_cli("kill", "-c", name, job_id, "--grace", "2", env=env, timeout=120)
        shutil.rmtree(folder)
    assert killed.returncode == 0, killed.stdout + killed.stderr
