"""`bench scaling`: the same job at several cluster sizes, its throughput, speedup and efficiency.

The job runs with mpirun on the leader over the first N nodes (leader first, hostfile order)
at each size; a throughput figure (images/sec, samples/sec ...) is parsed from its output.
Speedup is throughput over the smallest size's; scaling efficiency is speedup over the
ratio of ranks (1.0 = perfectly linear), as in the seeds' 8 -> 32 -> 256 GPU tables.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from clustertool.core import nodeset
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent

NUM = r"[0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
UNIT = r"(?:images|imgs?|samples|sequences|seqs|tokens|examples)"
PER = r"(?:\s+per\s+(?P<per>gpu|rank|worker|device|process|node))?"
_ON = r"(?:\s+on\s+\d+\s+\w+(?:\(s\))?)?"
# "samples/sec: 5623.4", "total images/sec: 1234.5", "Total img/sec on 8 GPU(s): 987.6 +-3.4"
METRIC_AFTER = re.compile(rf"(?i)\b{UNIT}\s*/\s*s(?:ec(?:ond)?)?\b{PER}{_ON}\s*[:=]?\s*(?P<value>{NUM})")
# "throughput 5623.4 samples/sec"
METRIC_BEFORE = re.compile(rf"(?i)(?P<value>{NUM})\s*{UNIT}\s*/\s*s(?:ec(?:ond)?)?\b{PER}")
# Open MPI --tag-output "[1,3]<stdout>:", MPICH -l "3:", or "rank 3:" at the start of a line
RANK_TAG = re.compile(r"^\s*(?:\[\d+,(?P<a>\d+)\]<std\w+>:|\[(?P<b>\d+)\]\s|(?P<c>\d+):\s"
                      r"|rank\s+(?P<d>\d+)\s*[:\]])", re.I)


@dataclass
class Metric:
    value: float
    how: str  # which rule produced it, said to the user


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _rank_of(line: str) -> int | None:
    m = RANK_TAG.match(line)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


def _matches(line: str, regex: re.Pattern | None) -> Iterator[tuple[float, str | None]]:
    """(value, per) for each metric on the line."""
    if regex is not None:
        for m in regex.finditer(line):
            text = m.groupdict().get("value") or (m.group(1) if m.groups() else m.group(0))
            yield _number(text), None
        return
    for pattern in (METRIC_AFTER, METRIC_BEFORE):
        found = list(pattern.finditer(line))
        if found:
            for m in found:
                yield _number(m.group("value")), m.group("per")
            return


def parse_throughput(output: str, regex: str | None = None, ranks: int = 1) -> Metric | None:
    """The job's throughput from its output, or None.

    Rules, in order: the last line that says "total"; else, when lines carry rank tags,
    the sum over ranks of each rank's last figure; else the last figure.  Figures marked
    "per GPU/rank" are used only when nothing else is there, times ``ranks``.
    """
    compiled = compile_metric(regex) if regex else None
    totals, per_rank, plain, per_device = [], {}, [], []
    for line in output.splitlines():
        for value, per in _matches(line, compiled):
            rank = _rank_of(line)
            if per:
                per_device.append(value)
            elif "total" in line.lower():
                totals.append(value)
            elif rank is not None:
                per_rank[rank] = value
            else:
                plain.append(value)
    if totals:
        return Metric(totals[-1], "last 'total' line")
    if per_rank:
        return Metric(sum(per_rank.values()), f"sum over {len(per_rank)} rank-tagged outputs")
    if plain:
        return Metric(plain[-1], "last figure" if len(plain) > 1 else "the figure")
    if per_device:
        return Metric(per_device[-1] * ranks, f"per-device figure x {ranks} ranks")
    return None


def compile_metric(regex: str) -> re.Pattern:
    try:
        compiled = re.compile(regex)
    except re.error as exc:
        raise UsageError(f"--metric-regex {regex!r} is not a valid regular expression: {exc}") from None
    if compiled.groups < 1:
        raise UsageError(f"--metric-regex {regex!r} needs a group around the number, e.g. 'rate=([0-9.]+)'")
    return compiled


def parse_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct, sorted."""
    sizes = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--nodes {text!r}: expected a comma list of positive node counts",
                             hint="e.g. --nodes 1,2,4")
        sizes.append(int(part))
    if len(set(sizes)) != len(sizes):
        raise UsageError(f"--nodes {text!r}: a size appears twice")
    return sorted(sizes)


@dataclass
class Point:
    nodes: int
    ranks: int
    throughput: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    seconds: float = 0.0
    exit_code: int | None = None
    how: str = ""
    error: str | None = None
    log: str | None = None
    runs: list[float] = field(default_factory=list)  # each run's figure (median -> throughput)

    @property
    def ok(self) -> bool:
        return self.error is None and self.throughput is not None


@dataclass
class ScalingResult:
    """`bench scaling` on a cluster: one point per size."""

    cluster: str
    command: str
    points: list[Point] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.points) and all(p.ok for p in self.points)


def add_efficiency(points: list[Point]) -> list[Point]:
    """Speedup and efficiency against the smallest size that produced a figure."""
    base = next((p for p in sorted(points, key=lambda p: p.ranks) if p.ok), None)
    for p in points:
        if base is None or not p.ok or not base.throughput:
            p.speedup = p.efficiency = None
            continue
        assert p.throughput is not None  # p.ok
        p.speedup = p.throughput / base.throughput
        p.efficiency = p.speedup / (p.ranks / base.ranks)
    return points


def cordoned_note(cluster: ClusterRecord) -> str:
    """`` not cordoned (node-3 is cordoned)`` where cordoned workers are left out of a count, else ""."""
    names = [n.name for n in cluster.workers if n.cordoned]
    if not names:
        return ""
    return f" not cordoned ({nodeset.fold(names)} {'is' if len(names) == 1 else 'are'} cordoned)"


def job_argv(command: Sequence[str]) -> list[str]:
    """One argument is split like a shell would (no shell features); several are kept."""
    if not command:
        raise UsageError("no command given", hint="clustertool bench scaling --nodes 1,2,4 -- python train.py")
    return shlex.split(command[0]) if len(command) == 1 else list(command)


# (nodes, ranks per node (None: their slots), argv) -> (exit code, output, error)
Launcher = Callable[[list[Node], int | None, list[str]], tuple[int | None, str, str | None]]


def run_scaling(cluster: ClusterRecord, sizes: list[int], per_node: int | None, command: Sequence[str], *,
                launch: Launcher, regex: str | None = None, log_dir: Path | None = None,
                repeat: int = 1, report: Reporter = silent) -> ScalingResult:
    """Run the job at each size through ``launch(nodes, per_node, argv) -> (code, output, error)``.

    With ``repeat`` > 1 the sizes run round-robin (1, 2, 4, 1, 2, 4 ...), so drifting load on a
    shared machine hits every size alike, and each size reports the median of its runs.
    """
    ordered = cluster.schedulable  # servers are not ranks; cordoned nodes run no job
    if sizes[-1] > len(ordered):
        raise UsageError(f"--nodes asks for {sizes[-1]} nodes; cluster {cluster.name!r} has {len(ordered)}"
                         + cordoned_note(cluster))
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if regex:
        compile_metric(regex)
    argv = job_argv(command)
    out = ScalingResult(cluster.name, shlex.join(argv))
    points = {size: Point(nodes=size, ranks=size * (per_node or min(n.slots for n in ordered[:size])))
              for size in sizes}
    for round_ in range(1, repeat + 1):
        for size in sizes:
            point = points[size]
            run = f" (run {round_}/{repeat})" if repeat > 1 else ""
            report(f"{size} node(s), {point.ranks} rank(s){run}: {shlex.join(argv)}")
            _run_once(point, ordered[:size], argv, launch, regex, log_dir, round_ if repeat > 1 else None)
            last = point.runs[-1] if point.runs and point.error is None else None
            report(f"{size} node(s){run}: " + (f"{last:.1f}/s" if last is not None else str(point.error)))
    for point in points.values():
        if point.runs:
            point.throughput, point.error = statistics.median(point.runs), None
        out.points.append(point)
    add_efficiency(out.points)
    return out


def _run_once(point: Point, nodes: list[Node], argv: list[str], launch: Launcher, regex: str | None,
              log_dir: Path | None, round_: int | None) -> None:
    t0 = time.monotonic()
    code, output, error = launch(nodes, point.ranks // len(nodes), argv)
    point.seconds += time.monotonic() - t0
    point.exit_code = code
    metric = parse_throughput(output, regex, point.ranks)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        suffix = f".{round_}" if round_ else ""
        point.log = str(log_dir / f"scaling-{point.nodes}nodes{suffix}.log")
        Path(point.log).write_text(output)
    if error or code != 0:
        point.error = error or f"exit {code}"
    elif metric is None:
        point.error = "no throughput figure in the output"
    else:
        point.error = None
        point.runs.append(metric.value)
        point.how = metric.how


COLUMNS = ["nodes", "ranks", "throughput", "speedup", "efficiency", "seconds", "status"]


def rows(report_: ScalingResult) -> list[list[str]]:
    def fmt(v: float | None, spec: str) -> str:
        return "" if v is None else format(v, spec)

    return [[str(p.nodes), str(p.ranks), fmt(p.throughput, ".1f"), fmt(p.speedup, ".2f"),
             "" if p.efficiency is None else f"{100 * p.efficiency:.0f}%", f"{p.seconds:.1f}",
             "ok" if p.ok else p.error or ""] for p in report_.points]


def to_csv(report_: ScalingResult) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["nodes", "ranks", "throughput", "speedup", "efficiency", "seconds", "exit_code", "error"])
    def num(v: float | None, digits: int) -> float | str:
        return "" if v is None else round(v, digits)

    for p in report_.points:
        writer.writerow([p.nodes, p.ranks, num(p.throughput, 1), num(p.speedup, 3), num(p.efficiency, 3),
                         round(p.seconds, 1), p.exit_code, p.error or ""])
    return buf.getvalue()


def to_json(report_: ScalingResult) -> str:
    return json.dumps(asdict(report_), indent=2)
