"""Run under mpirun by test_stragglers_native.py: the plugin's ``servers`` allreduce (ctypes entry point) of 1 MiB
float32, ITERS times; the rank SLOW sleeps DELAY_MS before each one (a rank slowed on purpose: the others' data
reaches the reducers first, then waits for its).  Rank 0 prints one JSON line when done."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from clustertool.workloads.plugin_allreduce import PluginAllreduce


def main() -> int:
    iters, slow, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    x = np.full(1 << 18, float(rank + 1), dtype=np.float32)
    with PluginAllreduce(comm, algo="servers", strict=True) as ar:
        for _ in range(iters):
            if rank == slow:
                time.sleep(delay_ms / 1000.0)
            ar.allreduce(x.copy(), np.empty_like(x))
        servers = ar.servers
    if rank == 0:
        print(json.dumps({"iters": iters, "ranks": comm.Get_size(), "servers": servers}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
