#!/usr/bin/env python3
"""One rank of the GPU proof's training step (bench/nccl_gpu.py's ddp-* variants; not run by hand).

torch DistributedDataParallel, backend nccl (gloo with --device cpu, for tests without a GPU),
rank/size/rendezvous from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, over an MLP of --layers
square Linear layers of --width with GELU between (2048 x 6: 25.2M float32 parameters, so every
step allreduces 100 MB of gradients in DDP's 25 MB buckets). Synthetic data: each rank a fixed
random batch, the target a fixed random linear map of it, MSE loss, plain SGD.

--warmup-steps run untimed (DDP builds its buckets in the first); rank 0 times the last of them,
picks how many steps fill --seconds and end before --deadline (at least 1), and broadcasts the
count; every rank then runs them between two synchronizations. --out gets result_doc(): samples/s
of all ranks over the timed steps, the loss before and after, and a checksum of the parameters
(sum and sum of squares in float64): DDP keeps every rank's parameters identical only when every
rank received the same gradient sums, so differing checksums mean a broken allreduce.
"""

from __future__ import annotations

import os
import sys

# A script's own folder comes first on sys.path, and bench/copy.py would then shadow the standard
# library's copy (tarfile and torch import it): this folder goes to the END instead.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402


def _args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=25.0, help="timed steps fill about this long")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--deadline", type=float, default=0.0, help="the timed steps end before this (epoch seconds)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def plan_steps(step_s: float, seconds: float, deadline: float, now: float, margin: float = 1.3) -> int:
    """Timed steps: as many as fill `seconds` at `step_s` each (with a margin), ending 3 s before
    the deadline; at least 1."""
    room = seconds if not deadline else min(seconds, deadline - now - 3.0)
    return max(1, min(int(room / max(step_s * margin, 1e-6)), 100000))


def result_doc(*, rank: int, world: int, torch: str, nccl: str, params: int, batch: int, steps: int, seconds: float,
               loss_first: float | None, loss_last: float | None, checksum: list[float] | None,
               dtype: str = "float32") -> dict:
    """What each rank writes to --out (the stand-in of tests/cli writes the same)."""
    rate = steps * batch * world / seconds if steps and seconds > 0 else 0.0
    return {"rank": rank, "world": world, "torch": torch, "nccl": nccl, "params": params, "dtype": dtype,
            "batch": batch, "steps": steps, "seconds": seconds, "samples_per_s": rate, "loss_first": loss_first,
            "loss_last": loss_last, "checksum": checksum}


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _model(torch, width: int, layers: int):
    nn = torch.nn
    parts = []
    for i in range(layers):
        parts.append(nn.Linear(width, width))
        if i < layers - 1:
            parts.append(nn.GELU())
    return nn.Sequential(*parts)


def main(argv=None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        try:   # eager NCCL init where torch supports it (2.3+)
            dist.init_process_group(backend="nccl", rank=rank, world_size=world, device_id=device)
        except TypeError:
            dist.init_process_group(backend="nccl", rank=rank, world_size=world)
    else:
        device, nccl = torch.device("cpu"), "none (gloo)"
        dist.init_process_group(backend="gloo", rank=rank, world_size=world)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.manual_seed(0)                      # every rank starts from the same weights
    model = _model(torch, args.width, args.layers).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None, gradient_as_bucket_view=True)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1000 + rank)).to(device)
    proj = torch.randn(args.width, args.width, generator=torch.Generator().manual_seed(7)) / args.width ** 0.5
    y = x @ proj.to(device)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    doc = result_doc(rank=rank, world=world, torch=torch.__version__, nccl=nccl, params=params, batch=args.batch,
                     steps=0, seconds=0.0, loss_first=None, loss_last=None, checksum=None)
    _write(args.out, doc)
    loss_first, step_s = None, 0.0
    for _ in range(max(args.warmup_steps, 1)):
        began = time.perf_counter()
        loss = step()
        sync()
        step_s = time.perf_counter() - began
        loss_first = loss.item() if loss_first is None else loss_first
    count = torch.tensor([plan_steps(step_s, args.seconds, args.deadline, time.time())], device=device)
    dist.broadcast(count, src=0)
    steps = int(count.item())
    sync()
    began = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - began
    with torch.no_grad():
        flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
        checksum = [float(flat.sum()), float((flat * flat).sum())]
    doc = result_doc(rank=rank, world=world, torch=torch.__version__, nccl=nccl, params=params, batch=args.batch,
                     steps=steps, seconds=seconds, loss_first=loss_first, loss_last=loss.item(), checksum=checksum)
    _write(args.out, doc)
    print(f"rank {rank}: {steps} steps in {seconds:.2f} s, {doc['samples_per_s']:.1f} samples/s, loss "
          f"{loss_first:.4g} -> {doc['loss_last']:.4g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
