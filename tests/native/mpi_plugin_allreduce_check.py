"""Run under mpirun by test_plugin_allreduce.py: the plugin's allreduce (ctypes entry point,
handles over mpi4py) against Open MPI's MPI_Allreduce on the same inputs, for each algorithm
given on the command line. Rank 0 prints one JSON line with the outcome per algorithm."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from clustertool.workloads.plugin_allreduce import PluginAllreduce


def inputs(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + rank)
    return {
        # small integers in float32: every summation order gives the same bits
        "float32-exact": rng.integers(-50, 50, 300_001).astype(np.float32),
        "int32": rng.integers(-2**20, 2**20, 70_001).astype(np.int32),
        "int64": rng.integers(-2**40, 2**40, 5_003).astype(np.int64),
        # arbitrary floats: the order matters, so equal to MPI only up to rounding
        "float64-random": rng.standard_normal(100_003),
        "float32-random": rng.standard_normal(1_000_003).astype(np.float32),
    }


def main() -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    report = {}
    for algo in sys.argv[1:]:
        ar = PluginAllreduce(comm, algo=algo, strict=True)
        outcome = {"algorithm": ar.algorithm, "servers": ar.servers}
        for name, x in inputs(rank).items():
            want = np.empty_like(x)
            comm.Allreduce(x, want, op=MPI.SUM)
            got = ar.allreduce(x, np.empty_like(x))
            inplace = x.copy()
            ar.allreduce(inplace)
            same_bits_everywhere = all(comm.allgather(got.tobytes() == comm.bcast(got.tobytes(), root=0)))
            if name.endswith("random"):
                equal = bool(np.allclose(got, want, rtol=1e-5, atol=1e-5))
            else:
                equal = bool(np.array_equal(got, want))
            outcome[name] = {"equal_to_mpi": all(comm.allgather(equal)),
                             "bit_identical_on_every_rank": same_bits_everywhere,
                             "in_place_same": all(comm.allgather(bool(np.array_equal(inplace, got))))}
        ar.close()
        report[algo] = outcome
    if rank == 0:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
