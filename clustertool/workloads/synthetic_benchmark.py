"""Synthetic-data data-parallel training throughput on GPUs (the seeds' multi-node check).

A torchvision model (ResNet-50 by default) trains on random images that live on the GPU,
so the figure measures compute plus gradient allreduce, not the input pipeline.  Gradients
are averaged with Horovod when it is installed (``--backend horovod``), else with
``torch.distributed`` over NCCL, rank and size taken from mpirun's environment.  Rank 0
prints per-GPU and total images/sec, the lines `clustertool bench scaling` reads::

    Img/sec per GPU: 352.1 +-3.0
    Total img/sec on 16 GPU(s): 5633.6 +-48.0

    clustertool bench scaling --nodes 1,2,4 --per-node 8 -- python synthetic_benchmark.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _args(argv):
    p = argparse.ArgumentParser(description="synthetic-data data-parallel throughput")
    p.add_argument("--model", default="resnet50", help="a torchvision.models name")
    p.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--steps-per-iter", type=int, default=10)
    p.add_argument("--iters", type=int, default=10, help="timed iterations (each --steps-per-iter steps)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 (horovod)")
    p.add_argument("--backend", choices=("auto", "horovod", "torch"), default="auto")
    return p.parse_args(argv)


class _Torch:
    """torch.distributed over NCCL, started from Open MPI's environment."""

    def __init__(self):
        import torch.distributed as dist

        env = os.environ
        self.rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", 0)))
        self.size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
        self.local_rank = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("LOCAL_RANK", 0)))
        env.setdefault("MASTER_PORT", "29500")
        if "MASTER_ADDR" not in env and env.get("CLUSTERTOOL_LEADER_ADDR"):  # set by bench scaling
            env["MASTER_ADDR"] = env["CLUSTERTOOL_LEADER_ADDR"]
        if "MASTER_ADDR" not in env:
            raise SystemExit("set MASTER_ADDR to the leader's address (e.g. -x MASTER_ADDR=10.0.0.11)")
        dist.init_process_group("nccl", rank=self.rank, world_size=self.size)
        self.dist = dist

    def wrap(self, model, optimizer, args):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.local_rank]), optimizer

    def mean(self, value: float) -> float:
        return value  # rank 0 reports; all ranks run in lockstep


class _Horovod:
    def __init__(self):
        import horovod.torch as hvd

        hvd.init()
        self.hvd, self.rank, self.size, self.local_rank = hvd, hvd.rank(), hvd.size(), hvd.local_rank()

    def wrap(self, model, optimizer, args):
        hvd = self.hvd
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def mean(self, value: float) -> float:
        import torch

        return float(self.hvd.allreduce(torch.tensor(value), name="mean"))


def _backend(name: str):
    if name in ("auto", "horovod"):
        try:
            return _Horovod()
        except ImportError:
            if name == "horovod":
                raise
    return _Torch()


def main(argv=None) -> int:
    args = _args(argv)
    import torch
    import torch.nn.functional as F
    from torchvision import models

    comm = _backend(args.backend)
    torch.cuda.set_device(comm.local_rank)
    torch.backends.cudnn.benchmark = True
    model = getattr(models, args.model)().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * comm.size, momentum=0.9)
    model, optimizer = comm.wrap(model, optimizer, args)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device="cuda")
    target = torch.randint(0, 1000, (args.batch_size,), device="cuda")

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    rates = []
    for i in range(args.iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps_per_iter):
            step()
        torch.cuda.synchronize()
        rate = args.batch_size * args.steps_per_iter / (time.perf_counter() - t0)
        rates.append(comm.mean(rate))
        if comm.rank == 0:
            print(f"Iter #{i}: {rate:.1f} img/sec per GPU", flush=True)
    if comm.rank == 0:
        mean = statistics.mean(rates)
        spread = 1.96 * statistics.pstdev(rates)
        print(f"Img/sec per GPU: {mean:.1f} +-{spread:.1f}")
        print(f"Total img/sec on {comm.size} GPU(s): {comm.size * mean:.1f} +-{comm.size * spread:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
