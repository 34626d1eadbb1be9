#!/usr/bin/env python3
"""One rank of the GPU proof (started by bench/nccl_gpu.py; not meant to be run by hand).

torch.distributed over NCCL, rank/size/rendezvous from RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT. For each size, smallest first: float32 allreduce (sum) of a buffer whose element
i on rank r is (i % 17) + r, `--warmup` untimed then `--iters` timed one by one with CUDA
events; the last result is compared with the CPU reference W*(i % 17) + W*(W-1)/2 (exact in
float32). `--out` is rewritten after every size, so a rank stopped from outside still leaves
what it finished. Before each size after the first, rank 0 decides from the last size's time
whether the next one ends before `--deadline` (seconds since the epoch) and broadcasts the
decision, so every rank stops at the same size instead of one waiting in a collective; with a
deadline, rank 0 also decides after each timed iteration whether another fits (a slow paced
size then ends with fewer iterations, recorded as `iters`, instead of being cut off unmeasured).
`--device cpu` runs the same on gloo (timed with the wall clock), for tests without a GPU.
"""

from __future__ import annotations

import os
import sys

# A script's own folder comes first on sys.path, and bench/copy.py would then shadow the standard
# library's copy (tarfile and torch import it): this folder goes to the END instead.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse
import json
import time


def _args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--deadline", type=float, default=0.0, help="stop before a size that would end after this")
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for tests without a GPU")
    return p.parse_args(argv)


def _init(dist, rank: int, world: int, device):
    kwargs = dict(backend="nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    if device.type != "cuda":
        dist.init_process_group(**kwargs)
        return
    try:   # eager NCCL init where torch supports it (2.3+): the communicator exists before timing
        dist.init_process_group(device_id=device, **kwargs)
    except TypeError:
        dist.init_process_group(**kwargs)


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def next_size_fits(deadline: float, now: float, last_size: int, last_seconds: float, size: int) -> bool:
    """The next size's time grows with its bytes; 1.5x margin for a slower step."""
    if not deadline or not last_size:
        return True
    return now + 1.5 * last_seconds * size / last_size < deadline


def next_iter_fits(deadline: float, now: float, last_iter_seconds: float) -> bool:
    """Another iteration of this size ends before the deadline (1.5x margin, and 1 s to write)."""
    return not deadline or now + 1.5 * last_iter_seconds + 1.0 < deadline


def _agree(torch, dist, device, go: bool) -> bool:
    flag = torch.tensor([1 if go else 0], device=device, dtype=torch.int32)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


class _Clock:
    """CUDA events around each allreduce on a GPU; the wall clock on the CPU (gloo is synchronous)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_us(self, fn) -> float:
        if not self.cuda:
            began = time.perf_counter()
            fn()
            return (time.perf_counter() - began) * 1e6
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        self.sync()
        start.record()
        fn()
        end.record()
        self.sync()
        return start.elapsed_time(end) * 1e3


def _one_size(torch, dist, device, size: int, rank: int, world: int, warmup: int, iters: int,
              deadline: float = 0.0) -> dict:
    n = size // 4
    src = torch.arange(n, device=device, dtype=torch.int64).remainder_(17).to(torch.float32).add_(rank)
    buf = torch.empty_like(src)
    clock = _Clock(torch, device)
    times = []
    for i in range(warmup + iters):
        buf.copy_(src)
        began = time.time()
        t = clock.time_us(lambda: dist.all_reduce(buf))
        if i >= warmup:
            times.append(t)
            if deadline and i < warmup + iters - 1 and not _agree(
                    torch, dist, device, next_iter_fits(deadline, time.time(), time.time() - began)):
                break
    ref = torch.arange(n, dtype=torch.int64).remainder_(17).to(torch.float32)
    ref.mul_(world).add_(world * (world - 1) / 2)
    wrong = int((buf.cpu() != ref).sum())
    t = sum(times) / len(times)
    algbw = size / (t * 1e-6) / 1e9
    return {"size": size, "time_us": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
            "wrong": wrong, "rank": rank, "world": world, "iters": len(times), "short": len(times) < iters}


def main(argv=None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    else:
        device, nccl = torch.device("cpu"), "none (gloo)"
    _init(dist, rank, world, device)
    doc = {"rank": rank, "torch": torch.__version__, "results": [], "stopped_before": None, "nccl": nccl}
    _write(args.out, doc)
    last_size, last_seconds = 0, 0.0
    for size in (int(s) for s in args.sizes.split(",")):
        go = next_size_fits(args.deadline, time.time(), last_size, last_seconds, size)
        if last_size and not _agree(torch, dist, device, go):
            doc["stopped_before"] = size
            break
        began = time.time()
        doc["results"].append(_one_size(torch, dist, device, size, rank, world, args.warmup, args.iters,
                                        args.deadline))
        last_size, last_seconds = size, time.time() - began
        _write(args.out, doc)
        print(f"rank {rank}: {size} bytes {doc['results'][-1]['time_us']:.1f} us "
              f"wrong {doc['results'][-1]['wrong']}", flush=True)
    _write(args.out, doc)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
