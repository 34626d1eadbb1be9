"""`bench compare`: the same job under several variants side by side (e.g. allreduce mpi vs servers).

Each variant is the command with ``{}`` replaced by the variant's name, run as a `clustertool
run` job over the same nodes; the throughput is parsed as `bench scaling` parses it.  With
``repeat`` > 1 the variants run round-robin (a, b, c, a, b, c ...), so drifting load on a shared
machine hits them alike, and each reports the median of its runs.  The first variant is the
baseline the others are compared with.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import statistics
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from clustertool.bench.chart import pyplot, short_command
from clustertool.bench.scaling import Launcher, compile_metric, cordoned_note, job_argv, parse_throughput
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent

PLACEHOLDER = "{}"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


@dataclass
class Variant:
    name: str
    argv: list[str]
    throughput: float | None = None
    ratio: float | None = None  # throughput over the baseline's (the first variant)
    seconds: float = 0.0
    runs: list[float] = field(default_factory=list)
    error: str | None = None
    logs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.throughput is not None


@dataclass
class CompareResult:
    cluster: str
    nodes: int
    ranks: int
    command: str
    variants: list[Variant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.variants) and all(v.ok for v in self.variants)


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in str(text).split(",") if v.strip()]
    bad = [v for v in names if not _NAME.match(v)]
    if not names or bad:
        raise UsageError(f"--variants {text!r}: expected a comma list of names (letters, digits, '.', '_', '-')")
    if len(set(names)) != len(names):
        raise UsageError(f"--variants {text!r}: a variant appears twice")
    return names


def variant_argv(command: Sequence[str], name: str, placeholder: bool = True) -> list[str]:
    """The command with every ``{}`` replaced by the variant's name (at least one must be there, unless the
    variants are not the command's: ``placeholder`` False, e.g. `--watch`)."""
    argv = job_argv(command)
    if placeholder and not any(PLACEHOLDER in word for word in argv):
        raise UsageError("the command has no {} for the variant",
                         hint="e.g. clustertool bench compare --variants mpi,servers -- python train.py "
                              "--allreduce {}")
    return [word.replace(PLACEHOLDER, name) for word in argv]


def run_compare(cluster: ClusterRecord, names: list[str], command: Sequence[str], *, launch: Launcher,
                nodes: int | None = None, per_node: int | None = None, regex: str | None = None, repeat: int = 1,
                log_dir: Path | None = None, report: Reporter = silent,
                before: Callable[[str], None] | None = None) -> CompareResult:
    """Run each variant ``repeat`` times, round-robin, on the first ``nodes`` workers (default all);
    ``before(name)``: called before each variant's run (the variant is then a state of the cluster, not a word of
    the command, which needs no ``{}``)."""
    workers = cluster.schedulable  # cordoned nodes run no job
    count = nodes or len(workers)
    if not 1 <= count <= len(workers):
        raise UsageError(f"--nodes {count}: cluster {cluster.name!r} has {len(workers)} worker node(s)"
                         + cordoned_note(cluster))
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if regex:
        compile_metric(regex)
    chosen = workers[:count]
    ranks = count * (per_node or min(n.slots for n in chosen))
    variants = [Variant(name, variant_argv(command, name, before is None)) for name in names]
    out = CompareResult(cluster.name, count, ranks, shlex.join(job_argv(command)), variants)
    for round_ in range(1, repeat + 1):
        for v in variants:
            run = f" (run {round_}/{repeat})" if repeat > 1 else ""
            report(f"{v.name}{run}: {shlex.join(v.argv)}")
            if before is not None:
                before(v.name)
            _run_once(v, chosen, ranks // count, launch, regex, ranks, log_dir, round_ if repeat > 1 else None)
            report(f"{v.name}{run}: " + (f"{v.runs[-1]:.1f}/s" if v.runs and v.error is None else str(v.error)))
    for v in variants:
        if v.runs:
            v.throughput, v.error = statistics.median(v.runs), None
    base = variants[0].throughput
    for v in variants:
        v.ratio = v.throughput / base if v.throughput is not None and base else None
    return out


def _run_once(v: Variant, nodes: list[Node], per_node: int, launch: Launcher, regex: str | None, ranks: int,
              log_dir: Path | None, round_: int | None) -> None:
    t0 = time.monotonic()
    code, output, error = launch(nodes, per_node, v.argv)
    v.seconds += time.monotonic() - t0
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"compare-{v.name}{f'.{round_}' if round_ else ''}.log"
        path.write_text(output)
        v.logs.append(str(path))
    metric = parse_throughput(output, regex, ranks)
    if error or code != 0:
        v.error = error or f"exit {code}"
    elif metric is None:
        v.error = "no throughput figure in the output"
    else:
        v.error = None
        v.runs.append(metric.value)


COLUMNS = ["variant", "ranks", "throughput", "vs first", "runs", "seconds", "status"]


def rows(result: CompareResult) -> list[list[str]]:
    return [[v.name, str(result.ranks), "" if v.throughput is None else f"{v.throughput:.1f}",
             "" if v.ratio is None else f"{v.ratio:.2f}x", " ".join(f"{r:.1f}" for r in v.runs),
             f"{v.seconds:.1f}", "ok" if v.ok else str(v.error)] for v in result.variants]


def to_csv(result: CompareResult) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["variant", "nodes", "ranks", "throughput", "ratio", "runs", "seconds", "error"])
    for v in result.variants:
        writer.writerow([v.name, result.nodes, result.ranks, "" if v.throughput is None else round(v.throughput, 1),
                         "" if v.ratio is None else round(v.ratio, 3), " ".join(f"{r:.1f}" for r in v.runs),
                         round(v.seconds, 1), v.error or ""])
    return buf.getvalue()


def to_json(result: CompareResult) -> str:
    return json.dumps(asdict(result), indent=2)


def write_chart(result: CompareResult, path: str | Path, title: str | None = None) -> Path:
    """A bar per variant (median throughput, the runs' spread as error bars, the ratio on top)."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(result.variants) + 2), 4))
    shown = [v for v in result.variants if v.ok]
    names = [v.name for v in shown]
    values = [v.throughput for v in shown if v.throughput is not None]  # every ok variant has one
    spread = [(t - min(v.runs), max(v.runs) - t) for v, t in zip(shown, values)]
    bars = ax.bar(names, values, color=["tab:grey"] + ["tab:blue"] * (len(shown) - 1),
                  yerr=list(zip(*spread)) if shown else None, capsize=5)
    for bar, v in zip(bars, shown):
        ax.annotate(f"{v.throughput:.0f}/s" + (f"\n{v.ratio:.2f}x" if v.ratio is not None else ""),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points",
                    xytext=(0, 4), ha="center", va="bottom", fontsize=9)
    top = max(values or [1.0])
    ax.set(ylabel="throughput (per second)", ylim=(0, top * 1.3),
           title=f"{result.nodes} node(s), {result.ranks} rank(s)")
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(title or f"{result.cluster}: {short_command(result.command)}", 90), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
