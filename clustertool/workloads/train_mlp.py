"""A CPU data-parallel training workload: a numpy MLP, gradients averaged across ranks.

Each rank trains the same model on its own shard of the data (synthetic, or a dataset made
with ``--make-dataset`` and copied to every node); after every backward pass the gradients
are summed across ranks with one allreduce on a flat float32 buffer and divided by the
number of ranks, as Horovod and DDP do.  ``--allreduce`` picks who sums: ``mpi`` (Open MPI's
``MPI_Allreduce``, the default) or the clustertool plugin through its C entry point
(``plugin_allreduce.py``): ``servers`` (reduction servers named by ``CLUSTERTOOL_REDUCERS``),
``sharded`` or ``ring``.  Rank 0 prints, at the end::

    ranks: 4
    allreduce: servers (plugin, 4 reduction servers)
    step: 182.1 ms (compute 150.3 ms, allreduce 31.8 ms)
    loss: 2.3026 -> 1.1840
    samples/sec: 5623.4

``samples/sec`` is the whole job's throughput (all ranks).  The per-rank batch is fixed, so
more ranks means more samples per step (weak scaling, like the seeds' GPU benchmarks).
Each rank uses one BLAS thread so one rank is one core's worth of compute.

    mpirun -np 4 python train_mlp.py --steps 20 [--data /scratch/data/train.npz] [--allreduce servers]
    python train_mlp.py --make-dataset /scratch/data [--samples 20000]

Runs without mpi4py as a single process (ranks: 1).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import numpy as np  # noqa: E402

if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable

    from mpi4py import MPI

try:  # run as a script on a node: the sibling file (stdlib + numpy), no clustertool install needed
    import plugin_allreduce  # noqa: E402
except ImportError:
    from clustertool.workloads import plugin_allreduce  # noqa: E402

FEATURES, CLASSES = 256, 10


class _SingleComm:
    """Stands in for MPI.COMM_WORLD when mpi4py is absent (one rank)."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Allreduce(self, send: object, recv: object, op: object = None) -> None:
        return None

    def Barrier(self) -> None:
        return None

    def allreduce(self, value: float, op: object = None) -> float:
        return value

    def allgather(self, sendobj: object) -> list[object]:
        return [sendobj]


def _comm() -> tuple[_SingleComm | MPI.Intracomm, ModuleType | None]:
    try:
        from mpi4py import MPI
    except ImportError:
        return _SingleComm(), None
    return MPI.COMM_WORLD, MPI


def make_reducer(comm: _SingleComm | MPI.Intracomm, mpi: ModuleType | None, how: str,
                 library: str | None) -> tuple[str, Callable[[np.ndarray], object], Callable[[], object]]:
    """The gradient sum: (label, function summing a float32 array in place, closer)."""
    if how == "mpi":
        if comm.Get_size() == 1:
            return "mpi", (lambda flat: None), (lambda: None)
        assert mpi is not None  # more than one rank: mpi4py's communicator
        return "mpi", (lambda flat: comm.Allreduce(mpi.IN_PLACE, flat, op=mpi.SUM)), (lambda: None)
    ar = plugin_allreduce.PluginAllreduce(comm, algo=how, library=library, strict=True)
    label = f"{ar.algorithm} (plugin" + (f", {ar.servers} reduction servers)" if ar.servers else ")")
    return label, ar.allreduce, ar.close


def teacher_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels from a fixed random linear teacher, so the loss can fall."""
    rng = np.random.default_rng(seed)
    teacher = np.random.default_rng(12345).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    return x, np.argmax(x @ teacher, axis=1)


def make_dataset(directory: str, samples: int) -> str:
    os.makedirs(directory, exist_ok=True)
    x, y = teacher_data(samples, seed=7)
    path = os.path.join(directory, "train.npz")
    np.savez(path, x=x, y=y)
    return path


def init_params(hidden: int, layers: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # same on every rank
    sizes = [FEATURES] + [hidden] * layers + [CLASSES]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, dtype=np.float32))
    return params


def forward_backward(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    acts = [x]
    h = x
    n_layers = len(params) // 2
    for i in range(n_layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n_layers - 1:
            h = np.maximum(h, 0.0)
        acts.append(h)
    logits = acts[-1] - acts[-1].max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    batch = x.shape[0]
    loss = float(-np.log(probs[np.arange(batch), y] + 1e-9).mean())
    grad = probs
    grad[np.arange(batch), y] -= 1.0
    grad /= batch
    grads: list[np.ndarray] = [None] * len(params)  # type: ignore[list-item]
    for i in reversed(range(n_layers)):
        grads[2 * i] = acts[i].T @ grad
        grads[2 * i + 1] = grad.sum(axis=0)
        if i > 0:
            grad = (grad @ params[2 * i].T) * (acts[i] > 0)
    return loss, grads


def load_shard(path: str | None, rank: int, world: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    if path:
        data = np.load(path)
        return data["x"][rank::world], data["y"][rank::world]
    return teacher_data(batch * 8, seed=100 + rank)


def train(args: argparse.Namespace) -> int:
    comm, mpi = _comm()
    rank, world = comm.Get_rank(), comm.Get_size()
    x_all, y_all = load_shard(args.data, rank, world, args.batch)
    if len(x_all) < args.batch:
        sys.stderr.write(f"rank {rank}: shard has {len(x_all)} samples, fewer than --batch {args.batch}\n")
        return 2
    params = init_params(args.hidden, args.layers)
    flat = np.empty(sum(p.size for p in params), dtype=np.float32)
    try:
        label, reduce_sum, close = make_reducer(comm, mpi, args.allreduce, args.plugin_lib)
    except RuntimeError as exc:  # PluginAllreduceError: one line, no traceback
        sys.stderr.write(f"rank {rank}: --allreduce {args.allreduce}: {exc}\n")
        return 2
    compute = reduce_time = 0.0
    losses = []
    rng = np.random.default_rng(rank)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            comm.Barrier()
            start = time.perf_counter()
            compute = reduce_time = 0.0
        t0 = time.perf_counter()
        idx = rng.integers(0, len(x_all), args.batch)
        loss, grads = forward_backward(params, x_all[idx], y_all[idx])
        offset = 0
        for g in grads:
            flat[offset:offset + g.size] = g.ravel()
            offset += g.size
        t1 = time.perf_counter()
        if world > 1:
            try:
                reduce_sum(flat)
            except RuntimeError as exc:  # the plugin's error: one line (it names the server), exit 1
                sys.stderr.write(f"rank {rank}: step {step}: {exc}\n")
                close()
                return 1
            flat /= world
        t2 = time.perf_counter()
        offset = 0
        for p in params:
            p -= args.lr * flat[offset:offset + p.size].reshape(p.shape)
            offset += p.size
        compute += (t1 - t0) + (time.perf_counter() - t2)
        reduce_time += t2 - t1
        losses.append(loss)
    comm.Barrier()
    close()
    took = time.perf_counter() - start
    elapsed = comm.allreduce(took, op=mpi.MAX) if mpi is not None else took  # the slowest rank's
    if rank == 0:
        steps = args.steps
        print(f"ranks: {world}")
        print(f"allreduce: {label}")
        print(f"params: {flat.size} ({flat.nbytes / 2**20:.1f} MiB of gradients per step)")
        print(f"step: {1000 * elapsed / steps:.1f} ms (compute {1000 * compute / steps:.1f} ms, "
              f"allreduce {1000 * reduce_time / steps:.1f} ms)")
        print(f"loss: {losses[0]:.4f} -> {np.mean(losses[-5:]):.4f}")
        print(f"samples/sec: {world * args.batch * steps / elapsed:.1f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="numpy MLP, data parallel over MPI Allreduce or the clustertool plugin")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch", type=int, default=512, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--allreduce", choices=["mpi", "servers", "sharded", "ring"], default="mpi",
                   help="who sums the gradients: Open MPI, or the clustertool plugin's algorithm "
                        "(servers needs CLUSTERTOOL_REDUCERS)")
    p.add_argument("--plugin-lib", help="path of libnccl-net-clustertool.so (default: CLUSTERTOOL_PLUGIN_LIB, "
                                        "the loader's path, this checkout's native/build)")
    p.add_argument("--data", help="a train.npz made by --make-dataset (default: synthetic)")
    p.add_argument("--make-dataset", metavar="DIR", help="write DIR/train.npz and exit")
    p.add_argument("--samples", type=int, default=20000, help="samples for --make-dataset")
    args = p.parse_args(argv)
    if args.make_dataset:
        print(f"wrote {make_dataset(args.make_dataset, args.samples)}")
        return 0
    if args.steps < 1 or args.batch < 1:
        p.error("--steps and --batch must be positive")
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
