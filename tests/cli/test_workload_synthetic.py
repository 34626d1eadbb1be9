"""The synthetic-data workload really trains across processes on a CPU: two ranks started by
torch's own launcher (torchrun) average gradients over gloo with the inline tiny model and
print the throughput lines `bench scaling` reads. Its GPU path (ResNet-50 over NCCL) needs a
GPU and torchvision, which this machine does not have."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clustertool import workloads
from clustertool.bench import scaling

pytestmark = pytest.mark.cli
torch = pytest.importorskip("torch", reason="the workload needs PyTorch (make venv installs it; NO_TORCH=1 skips)")
SCRIPT = str(workloads.DIR / "synthetic_benchmark.py")


def test_two_cpu_ranks_train_over_gloo_and_report_total_throughput(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # --standalone: torchrun binds its own free port (no pick-then-bind race with concurrent runs)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           SCRIPT, "--device", "cpu", "--iters", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Model tiny on cpu, batch 16, 32px, 2 rank(s)" in out
    assert out.count("img/sec per rank") == 2, "rank 0 alone reports each timed iteration"
    metric = scaling.parse_throughput(out)
    assert metric is not None and metric.value > 0 and metric.how == "last 'total' line"
    assert "Total img/sec on 2 CPU(s)" in out


def test_cuda_without_a_gpu_is_a_one_line_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == "--device cuda: torch sees no GPU (use --device cpu)"
