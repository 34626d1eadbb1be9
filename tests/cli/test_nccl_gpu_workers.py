"""The GPU proof's real workers (bench/nccl_gpu_worker.py, bench/nccl_gpu_ddp.py), run here on
PyTorch's gloo backend with --device cpu: the same code the GPU machine runs over NCCL (rendezvous,
sizes, the per-size and per-iteration deadline, the result files, DDP's step count agreement and
the parameter checksum), without CUDA. Real torch, 2 ranks on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cli
pytest.importorskip("torch")
BENCH = REPO / "bench"


def run_ranks(tmp_path: Path, script: str, args: list[str], world: int = 2) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(BENCH / script), *args, "--device", "cpu",
                                       "--out", str(tmp_path / f"r{r}.json")], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, outs
    return [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(world)]


def test_the_allreduce_worker_measures_every_size_and_checks_every_element(tmp_path):
    docs = run_ranks(tmp_path, "nccl_gpu_worker.py", ["--sizes", "4096,65536", "--iters", "3", "--warmup", "1"])
    for doc in docs:
        assert [r["size"] for r in doc["results"]] == [4096, 65536] and doc["stopped_before"] is None
        assert all(r["wrong"] == 0 and r["iters"] == 3 and not r["short"] and r["busbw"] > 0 for r in doc["results"])


def test_a_passed_deadline_ends_the_size_after_one_iteration_on_every_rank(tmp_path):
    """The first size always runs; past the deadline rank 0 stops it after its first timed iteration
    and every rank follows (no rank left waiting in a collective), then no further size starts."""
    docs = run_ranks(tmp_path, "nccl_gpu_worker.py", ["--sizes", "4096,65536", "--iters", "5", "--warmup", "1",
                                                      "--deadline", f"{time.time() - 1:.1f}"])
    for doc in docs:
        assert [(r["size"], r["iters"], r["short"], r["wrong"]) for r in doc["results"]] == [(4096, 1, True, 0)]
        assert doc["stopped_before"] == 65536


def test_the_ddp_worker_trains_agrees_on_steps_and_ends_with_the_same_parameters(tmp_path):
    docs = run_ranks(tmp_path, "nccl_gpu_ddp.py", ["--width", "64", "--layers", "3", "--batch", "8", "--seconds", "1",
                                                   "--warmup-steps", "2"])
    assert docs[0]["steps"] == docs[1]["steps"] >= 1, "rank 0's count reached every rank"
    assert docs[0]["params"] == 3 * (64 * 64 + 64) and docs[0]["world"] == 2
    assert docs[0]["checksum"] == docs[1]["checksum"], "DDP keeps the ranks' parameters identical"
    for doc in docs:
        assert doc["samples_per_s"] == pytest.approx(doc["steps"] * 8 * 2 / doc["seconds"])
        assert doc["loss_first"] > 0 and doc["loss_last"] > 0
