"""What a user asks of `bench allreduce`, as one typed value: built alike by the CLI and the API, checked
once when made (a bad value is one UsageError naming the flag, with a hint)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from clustertool.bench.allreduce import check_run, parse_algos, parse_bytes, parse_sizes
from clustertool.core.errors import UsageError


@dataclass(frozen=True)
class AllreduceBenchRequest:
    """One `clustertool bench allreduce`: collnet_bench on every worker (one rank per node)."""

    sizes: str = "1M:256M"  # MIN:MAX in bytes (K/M/G), doubling
    algos: tuple[str, ...] = ("sharded", "ring", "mpi")  # of servers, sharded, ring, mpi
    dtype: str = "float"
    op: str = "sum"
    iters: int = 5
    warmup: int = 1
    ifname: str | None = None  # the interface the plugin binds to (default: the first non-loopback)
    env: tuple[str, ...] = ()  # VAR or VAR=VALUE for every rank
    timeout: float = 3600.0  # seconds before the run counts as hung
    tuner_csv: str | None = None  # write a tuner table from the results here
    request_bytes: int = 256 << 10  # each allreduce as NCCL's CollNet proxy sends it: requests of this size,
    depth: int = 8  # at most this many outstanding, the oldest tested first
    one_request: bool = False  # each allreduce as one request instead (the old form)

    def __post_init__(self) -> None:
        self.size_range()
        object.__setattr__(self, "algos", tuple(parse_algos(",".join(self.algos))))
        check_run(self.dtype, self.op, self.iters, self.warmup, request=self.request_bytes, depth=self.depth,
                  one_request=self.one_request)

    def size_range(self) -> tuple[int, int]:
        return parse_sizes(self.sizes)

    @classmethod
    def of(cls, *, sizes: str = "1M:256M", algo: str | Sequence[str] = "sharded,ring,mpi", dtype: str = "float",
           op: str = "sum", iters: int = 5, warmup: int = 1, ifname: str | None = None, env: Sequence[str] = (),
           timeout: float = 3600.0, tuner_csv: str | os.PathLike[str] | None = None, request_size: str | int = "256K",
           depth: int = 8, one_request: bool = False) -> "AllreduceBenchRequest":
        """From the flags (the API's keywords): ``algo`` a comma list or a list, ``tuner_csv`` a path,
        ``request_size`` bytes (K/M/G, the flag --request)."""
        algos = tuple(parse_algos(algo if isinstance(algo, str) else ",".join(algo)))
        return cls(sizes=sizes, algos=algos, dtype=dtype, op=op, iters=iters, warmup=warmup, ifname=ifname,
                   env=tuple(str(e) for e in env), timeout=timeout,
                   tuner_csv=None if tuner_csv is None else os.fspath(tuner_csv),
                   request_bytes=request_size if isinstance(request_size, int) else _request_bytes(request_size),
                   depth=depth,
                   one_request=one_request)


def _request_bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except UsageError as e:
        raise UsageError(f"--request {text!r}: not a size", hint="e.g. --request 256K (NCCL's chunk)") from e
