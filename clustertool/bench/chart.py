"""The scaling chart: throughput and efficiency against ranks, as a PNG (matplotlib, Agg)."""

from __future__ import annotations

import shlex
from pathlib import Path

from clustertool.bench.scaling import ScalingResult
from clustertool.core.errors import MissingPrerequisite


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display), or a one-line error saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingPrerequisite("the chart needs matplotlib", hint="pip install 'clustertool[train]'") from None
    return plt


def write_chart(report: ScalingResult, path: str | Path, title: str | None = None) -> Path:
    """Two panels: throughput (with the linear ideal) and scaling efficiency, both vs ranks."""
    plt = pyplot()
    points = [p for p in report.points if p.ok]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ranks = [p.ranks for p in points]
    if points:
        base = points[0]
        left.plot(ranks, [p.throughput for p in points], "o-", label="measured (median)" if
                  any(len(p.runs) > 1 for p in points) else "measured")
        spread = [(p.throughput - min(p.runs or [p.throughput]), max(p.runs or [p.throughput]) - p.throughput)
                  for p in points]
        left.errorbar(ranks, [p.throughput for p in points], yerr=list(zip(*spread)), fmt="none",
                      ecolor="tab:blue", capsize=4, alpha=0.6)
        left.plot(ranks, [base.throughput * r / base.ranks for r in ranks], "--", color="grey", label="linear")
        right.plot(ranks, [100 * p.efficiency for p in points], "o-", color="tab:green")
        for p in points:
            right.annotate(f"{100 * p.efficiency:.0f}%", (p.ranks, 100 * p.efficiency),
                           textcoords="offset points", xytext=(0, 6), ha="center")
    left.set(xlabel="ranks", ylabel="throughput (per second)", title="throughput")
    left.legend()
    top = max([110.0] + [100 * p.efficiency * 1.12 for p in points])  # superlinear points stay visible
    right.set(xlabel="ranks", ylabel="scaling efficiency (%)", title="scaling efficiency", ylim=(0, top))
    for ax in (left, right):
        ax.set_xticks(ranks or [1])
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"{report.cluster}: {short_command(report.command)}"[:110], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def short_command(command: str) -> str:
    """From the script on: `env PYTHONPATH=.. python /x/train.py --steps 5` -> `train.py --steps 5`."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word.endswith(".py"):
            return " ".join([Path(word).name] + words[i + 1:])
    return command
