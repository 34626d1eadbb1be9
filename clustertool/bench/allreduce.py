"""`bench allreduce`: collnet_bench across the cluster with mpirun, parsed into rows.

The deployed collnet_bench (next to the plugin) runs one rank per node and prints an
all_reduce_perf-style table for the plugin's algorithms and for Open MPI's own
MPI_Allreduce on the same ranks.  Rows can become a tuner table (tuner CSV).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from clustertool.core.errors import UsageError

ALGOS = ("servers", "sharded", "ring", "mpi")
PLUGIN_ALGOS = ("servers", "sharded", "ring")
DTYPES = ("float", "half", "bfloat16", "double", "int32", "uint32", "int64", "uint64", "int8", "uint8")
COLUMNS = ("size", "count", "type", "redop", "algo", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")
_ROW_RE = re.compile(r"(\d+)\s+(\d+)\s+([a-z0-9]+)\s+(sum|prod|max|min)\s+(servers|sharded|ring|mpi)\s+"
                     r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(-?\d+)\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    algo: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgKMG]?)i?[bB]?\s*", text)
    if not m:
        raise UsageError(f"not a size: {text!r}", hint="use e.g. 1M, 64K, 1G or a byte count")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_sizes(text: str) -> tuple[int, int]:
    """'1M:256M' -> (1 MiB, 256 MiB); '64M' -> (64 MiB, 64 MiB)."""
    lo, _, hi = text.partition(":")
    try:
        a, b = parse_bytes(lo), parse_bytes(hi or lo)
    except UsageError as exc:  # the flag named, as every bad value of a request is
        raise UsageError(f"--sizes {text!r}: {exc.message}", hint=exc.hint) from None
    if a < 1 or a > b:
        raise UsageError(f"--sizes {text!r}: want MIN:MAX with 0 < MIN <= MAX")
    return a, b


def parse_algos(text: str) -> list[str]:
    algos = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGOS]
    if bad or not algos:
        raise UsageError(f"--algo: unknown {', '.join(bad) or '(empty)'}", hint=f"choose from {', '.join(ALGOS)}")
    return algos


def check_servers(algos: Sequence[str], cluster_name: str, servers: int) -> None:
    """``servers`` needs reduction servers in the cluster: one line saying how to get them."""
    if "servers" in algos and servers == 0:
        raise UsageError(f"--algo servers: cluster {cluster_name!r} has no reduction servers",
                         hint="bring one up with `clustertool up ... --reduction-servers K` (static: --servers "
                              "HOST,HOST), or leave servers out of --algo")


def check_run(dtype: str, op: str, iters: int, warmup: int, factor: int = 2, request: int = 256 << 10,
              depth: int = 8, one_request: bool = False) -> None:
    """collnet_bench's --dtype, --op, --iters, --warmup, --factor, --request and --depth, each a value it takes."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} unknown", hint=f"choose from {', '.join(DTYPES)}")
    if op not in ("sum", "prod", "min", "max"):
        raise UsageError(f"--op {op!r} unknown", hint="sum, prod, min or max")
    if iters < 1 or warmup < 0 or factor < 2:
        raise UsageError("--iters must be >= 1, --warmup >= 0, --factor >= 2", hint="e.g. --iters 20 --warmup 5")
    if not one_request and (request < 1 or not 1 <= depth <= 1024):
        raise UsageError("--request must be >= 1 byte and --depth 1..1024",
                         hint="e.g. --request 256K --depth 8 (NCCL's shape), or --one-request")


def bench_argv(bench_path: str, sizes: tuple[int, int], algos: Sequence[str], *, dtype: str = "float",
               op: str = "sum", iters: int = 5, warmup: int = 1, factor: int = 2, check: bool = True,
               request: int = 256 << 10, depth: int = 8, one_request: bool = False) -> list[str]:
    """collnet_bench's command line. By default each allreduce goes to the plugin as NCCL's
    CollNet proxy sends it: requests of ``request`` bytes, at most ``depth`` outstanding, the
    oldest tested first; ``one_request`` posts each allreduce as one request instead."""
    check_run(dtype, op, iters, warmup, factor, request, depth, one_request)
    argv = [bench_path, "-b", str(sizes[0]), "-e", str(sizes[1]), "-f", str(factor), "-n", str(iters),
            "-w", str(warmup), "-c", "1" if check else "0", "-d", dtype, "-o", op, "-a", ",".join(algos)]
    return argv if one_request else argv + ["-r", str(request), "-q", str(depth)]


def parse_rows(output: str) -> list[Row]:
    """Table rows from collnet_bench output (mpirun --tag-output prefixes are fine)."""
    rows = []
    for line in output.splitlines():
        m = _ROW_RE.search(line)
        if m:
            g = m.groups()
            rows.append(Row(int(g[0]), int(g[1]), g[2], g[3], g[4], float(g[5]), float(g[6]), float(g[7]), int(g[8])))
    return rows


def size_text(n: int) -> str:
    """A message size as people write it: 64K, 1M, 256M, 2G (bytes when not a whole K)."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """The all_reduce_perf table: size in bytes and count, as nccl-tests prints them."""
    return [[str(r.size), str(r.count), r.dtype, r.redop, r.algo, f"{r.time_us:.1f}", f"{r.algbw:.4f}",
             f"{r.busbw:.4f}", str(r.wrong)] for r in rows]


def side_by_side(rows: Sequence[Row]) -> list[list[str]]:
    """One line per size: busbw of each algorithm and the plugin's best over MPI."""
    sizes = sorted({r.size for r in rows})
    algos = [a for a in ALGOS if any(r.algo == a for r in rows)]
    out = []
    for s in sizes:
        bw = {r.algo: r.busbw for r in rows if r.size == s}
        line = [size_text(s)] + [f"{bw[a]:.4f}" if a in bw else "-" for a in algos]
        best = max((bw[a] for a in PLUGIN_ALGOS if a in bw), default=None)
        line.append(f"{best / bw['mpi']:.2f}x" if best and bw.get("mpi") else "-")
        out.append(line)
    return out


def side_by_side_columns(rows: Sequence[Row]) -> list[str]:
    algos = [a for a in ALGOS if any(r.algo == a for r in rows)]
    return ["size"] + [f"{a} busbw" for a in algos] + ["plugin/mpi"]


def link_ratios(rows: Sequence[Row], rate_bits: int) -> str:
    """One line: busbw / B per algorithm at the largest size, B the cluster's link rate."""
    size = max(r.size for r in rows)
    b = rate_bits / 8 / 1e9  # GB/s, as busbw
    parts = [f"{r.algo} {r.busbw / b:.2f}" for a in ALGOS for r in rows if r.size == size and r.algo == a]
    return f"busbw/B at {size_text(size)} (B = link rate, {rate_bits / 1e6:g} Mbit/s): {', '.join(parts)}"


def tuner_table(rows: Sequence[Row], nodes: int) -> str:
    """A tuner table: for each measured size, CollNet where the plugin beat MPI_Allreduce,
    NCCL's ring otherwise; each row covers sizes up to the next measured one."""
    sizes = sorted({r.size for r in rows})
    lines = ["collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks"]
    for i, s in enumerate(sizes):
        bw = {r.algo: r.busbw for r in rows if r.size == s}
        plugin = max((bw[a] for a in PLUGIN_ALGOS if a in bw), default=0.0)
        algo = "collnet_direct" if plugin > bw.get("mpi", 0.0) else "ring"
        lo = 0 if i == 0 else s
        hi = sizes[i + 1] - 1 if i + 1 < len(sizes) else 1 << 40
        lines.append(f"allreduce,{lo},{hi},{algo},simple,-1,{nodes},-1")
    return "\n".join(lines) + "\n"
