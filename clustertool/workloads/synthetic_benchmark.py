"""Synthetic-data data-parallel training throughput (the seeds' multi-node check).

On GPUs a torchvision model (ResNet-50 by default) trains on random images that live on the
GPU, so the figure measures compute plus gradient allreduce, not the input pipeline.
Gradients are averaged with Horovod when it is installed (``--backend horovod``), else with
``torch.distributed`` over NCCL. Without a GPU (or with ``--device cpu``) the same loop runs
on the CPU over gloo with a small convolutional network written here (``--model tiny``; no
torchvision needed) and small defaults, so the workload can be checked anywhere. Rank and
size come from mpirun's or torchrun's environment. Rank 0 prints per-device and total
images/sec, the lines `clustertool bench scaling` reads::

    Img/sec per GPU: 352.1 +-3.0                 (CPU path: "Img/sec per rank: ...")
    Total img/sec on 16 GPU(s): 5633.6 +-48.0    (CPU path: "Total img/sec on 2 CPU(s): ...")

    clustertool bench scaling --nodes 1,2,4 --per-node 8 -- python synthetic_benchmark.py
    torchrun --nproc-per-node 2 synthetic_benchmark.py --device cpu      # a CPU check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # torch loads in main (a fast --help; its types only for the checker)
    import torch
    from torch import nn

# GPU defaults, then the CPU ones (a small model and images, a few steps)
_DEFAULTS = {"cuda": dict(model="resnet50", batch_size=64, image_size=224, warmup_steps=10, steps_per_iter=10,
                          iters=10),
             "cpu": dict(model="tiny", batch_size=16, image_size=32, warmup_steps=1, steps_per_iter=3, iters=3)}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="synthetic-data data-parallel throughput")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda when torch sees a GPU, else cpu (gloo, --model tiny)")
    p.add_argument("--model", help="'tiny' (inline CNN) or a torchvision.models name (resnet50 on GPUs)")
    p.add_argument("--batch-size", type=int, help="images per rank per step (GPU 64, CPU 16)")
    p.add_argument("--image-size", type=int, help="GPU 224, CPU 32")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--steps-per-iter", type=int)
    p.add_argument("--iters", type=int, help="timed iterations (each --steps-per-iter steps)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 (horovod)")
    p.add_argument("--backend", choices=("auto", "horovod", "torch"), default="auto")
    return p.parse_args(argv)


def _resolve(args: argparse.Namespace, cuda_available: bool) -> argparse.Namespace:
    """Fill unset options from the device's defaults; refuse cuda without a GPU."""
    if args.device == "auto":
        args.device = "cuda" if cuda_available else "cpu"
    if args.device == "cuda" and not cuda_available:
        raise SystemExit("--device cuda: torch sees no GPU (use --device cpu)")
    for key, value in _DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cpu" and args.backend == "horovod":
        raise SystemExit("--backend horovod needs GPUs here; the CPU path uses torch.distributed over gloo")
    return args


def tiny_model(num_classes: int = 1000) -> nn.Module:
    """A small CNN: enough layers and parameters that the allreduce has real gradients to carry."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


class _Torch:
    """torch.distributed started from Open MPI's or torchrun's environment: NCCL on GPUs, gloo on CPUs."""

    def __init__(self, device: str):
        import torch.distributed as dist

        env = os.environ
        self.rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", 0)))
        self.size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
        self.local_rank = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("LOCAL_RANK", 0)))
        self.device = device
        env.setdefault("MASTER_PORT", "29500")
        if "MASTER_ADDR" not in env and env.get("CLUSTERTOOL_LEADER_ADDR"):  # set by bench scaling
            env["MASTER_ADDR"] = env["CLUSTERTOOL_LEADER_ADDR"]
        if "MASTER_ADDR" not in env:
            if self.size > 1:
                raise SystemExit("set MASTER_ADDR to the leader's address (e.g. -x MASTER_ADDR=10.0.0.11)")
            env["MASTER_ADDR"] = "127.0.0.1"
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=self.rank, world_size=self.size)
        self.dist = dist

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.local_rank] if self.device == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def mean(self, value: float) -> float:
        return value  # rank 0 reports; all ranks run in lockstep

    def close(self) -> None:
        # every rank reaches the end before any tears down: a gloo rank whose peer already
        # closed its pairs can abort in its own teardown ("terminate called ...")
        self.dist.barrier()
        self.dist.destroy_process_group()


class _Horovod:
    def __init__(self) -> None:
        import horovod.torch as hvd

        hvd.init()
        self.hvd, self.rank, self.size, self.local_rank = hvd, hvd.rank(), hvd.size(), hvd.local_rank()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
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

    def close(self) -> None:
        pass


def _backend(name: str, device: str) -> _Torch | _Horovod:
    if device == "cuda" and name in ("auto", "horovod"):
        try:
            return _Horovod()
        except ImportError:
            if name == "horovod":
                raise
    return _Torch(device)


def _model(name: str) -> nn.Module:
    if name == "tiny":
        return tiny_model()
    from torchvision import models  # only the GPU models need torchvision

    return getattr(models, name)()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch
    import torch.nn.functional as F

    args = _resolve(args, torch.cuda.is_available())
    comm = _backend(args.backend, args.device)
    sync: Callable[[], None]
    if args.device == "cuda":
        torch.cuda.set_device(comm.local_rank)
        torch.backends.cudnn.benchmark = True
        device, sync = torch.device("cuda"), torch.cuda.synchronize
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(comm.size, 1)))
        device, sync = torch.device("cpu"), (lambda: None)
    torch.manual_seed(1234 + comm.rank)
    model = _model(args.model).to(device)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * comm.size, momentum=0.9)
    model, optimizer = comm.wrap(model, optimizer, args)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    rates = []
    per, total = ("GPU", "GPU(s)") if args.device == "cuda" else ("rank", "CPU(s)")   # bench scaling reads these
    for i in range(args.iters):
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps_per_iter):
            step()
        sync()
        rate = args.batch_size * args.steps_per_iter / (time.perf_counter() - t0)
        rates.append(comm.mean(rate))
        if comm.rank == 0:
            print(f"Iter #{i}: {rate:.1f} img/sec per {per}", flush=True)
    if comm.rank == 0:
        mean = statistics.mean(rates)
        spread = 1.96 * statistics.pstdev(rates)
        print(f"Model {args.model} on {args.device}, batch {args.batch_size}, {args.image_size}px, {comm.size} rank(s)")
        print(f"Img/sec per {per}: {mean:.1f} +-{spread:.1f}")
        print(f"Total img/sec on {comm.size} {total}: {comm.size * mean:.1f} +-{comm.size * spread:.1f}", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
