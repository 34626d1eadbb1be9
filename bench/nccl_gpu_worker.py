#!/usr/bin/env python3
"""One rank of the GPU proof (started by bench/nccl_gpu.py; not meant to be run by hand).

torch.distributed over NCCL, rank/size/rendezvous from RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT. For each size: float32 allreduce (sum) of a buffer whose element i on rank r
is (i % 17) + r, `--warmup` untimed then `--iters` timed one by one with CUDA events;
the last result is compared with the CPU reference W*(i % 17) + W*(W-1)/2 (exact in
float32). Writes one JSON object per size to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _init(torch, dist, rank: int, world: int, device):
    kwargs = dict(backend="nccl", rank=rank, world_size=world)
    try:   # eager NCCL init where torch supports it (2.3+): the communicator exists before timing
        dist.init_process_group(device_id=device, **kwargs)
    except TypeError:
        dist.init_process_group(**kwargs)


def main(argv=None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    _init(torch, dist, rank, world, device)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        n = size // 4
        src = torch.arange(n, device=device, dtype=torch.int64).remainder_(17).to(torch.float32).add_(rank)
        buf = torch.empty_like(src)
        times = []
        for i in range(args.warmup + args.iters):
            buf.copy_(src)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            dist.all_reduce(buf)
            end.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(end) * 1e3)   # microseconds
        ref = torch.arange(n, dtype=torch.int64).remainder_(17).to(torch.float32)
        ref.mul_(world).add_(world * (world - 1) / 2)
        wrong = int((buf.cpu() != ref).sum())
        t = sum(times) / len(times)
        algbw = size / (t * 1e-6) / 1e9
        results.append({"size": size, "time_us": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
                        "wrong": wrong, "rank": rank, "world": world})
        print(f"rank {rank}: {size} bytes {t:.1f} us wrong {wrong}", flush=True)
    v = torch.cuda.nccl.version()
    with open(args.out, "w") as f:
        json.dump({"rank": rank, "torch": torch.__version__,
                   "nccl": ".".join(map(str, v)) if isinstance(v, tuple) else str(v), "results": results}, f)
    dist.barrier()
    time.sleep(0.2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
