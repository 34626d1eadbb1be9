"""A PyTorch DDP script as the tutorial writes it (`init_process_group("gloo")`, env:// by default,
nothing in it for this tool) runs unchanged under `clustertool run`: every rank gets RANK,
LOCAL_RANK, WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT.  Real parts: a 2-node local cluster
with 2 slots a node, Open MPI, PyTorch (CPU, gloo)."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from clustertool.workloads import node_python
from tests.conftest import run_cli
from tests.local.conftest import module_cluster, torch_teardown_abort  # PyTorch's exit abort

pytestmark = pytest.mark.local
torch = pytest.importorskip("torch", reason="PyTorch (CPU) is installed by `make venv`; NO_TORCH=1 skips it")

# The shape of PyTorch's "Getting started with DDP" example, written here: a toy model, one rank
# per process, gloo, the default env:// rendezvous, a few SGD steps, a line per rank.
TRAIN = '''
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    for _ in range(5):
        optimizer.zero_grad()
        loss_fn(ddp_model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
    total = sum(float(p.sum()) for p in model.parameters())
    print(f"rank {rank} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
          f"node {os.environ['NODE_RANK']} on {socket.gethostname()} params {total:.6f}", flush=True)
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (gloo aborts the process then)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 2, "dd", "--slots", "2")


@pytest.fixture(scope="module")
def script():
    folder = Path("/var/tmp") / f"ct-test-ddp-{uuid.uuid4().hex[:8]}"   # every local node sees /var/tmp
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    yield str(folder / "train.py")
    shutil.rmtree(folder)


def test_the_tutorial_ddp_script_runs_unchanged_under_run(cluster, script):
    name, env = cluster
    proc = run_cli("run", "-c", name, "--no-tag-output", "--follow", "--", *node_python(), script,
                   env=env, timeout=300)
    assert proc.returncode == 0 or torch_teardown_abort(proc), proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = re.findall(r"rank (\d) of (\d) local (\d) node (\d) on (\S+) params (\S+)", proc.stdout)
    assert sorted(int(r[0]) for r in lines) == [0, 1, 2, 3], proc.stdout
    by_rank = {int(r[0]): r for r in lines}
    assert {r[1] for r in lines} == {"4"}
    assert [(by_rank[i][2], by_rank[i][3], by_rank[i][4]) for i in range(4)] == [
        ("0", "0", "node-1"), ("1", "0", "node-1"), ("0", "1", "node-2"), ("1", "1", "node-2")]
    assert len({r[5] for r in lines}) == 1   # DDP kept every rank's parameters the same


def test_every_rank_of_a_job_gets_the_port_the_leader_found_free(cluster):
    name, env = cluster
    dry = run_cli("run", "-c", name, "--dry-run", "--", "true", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "MASTER_PORT=PORT" in dry.stdout and "NNODES=2" in dry.stdout   # chosen at the start, not before
    proc = run_cli("run", "-c", name, "--no-tag-output", "--follow", "--", "sh", "-c",
                   'echo "port=$MASTER_PORT addr=$MASTER_ADDR nodes=$NNODES"', env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = re.findall(r"port=(\d+) addr=(\S+) nodes=2", proc.stdout)
    assert len(found) == 4 and len(set(found)) == 1, proc.stdout   # every rank of the job agrees
    port, addr = found[0]
    assert 1024 <= int(port) <= 65535 and addr.startswith("10.213.")
