"""The scaling chart: throughput and efficiency against ranks, as a PNG (matplotlib, Agg)."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import ModuleType

from clustertool.bench.scaling import ScalingResult
from clustertool.core.errors import MissingPrerequisite


def pyplot() -> ModuleType:
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
    measured = [p.throughput for p in points if p.throughput is not None]  # every ok point has one
    # (ranks, efficiency %): none when the smallest size measured 0/s (add_efficiency leaves them None)
    rated = [(p.ranks, 100 * p.efficiency) for p in points if p.efficiency is not None]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ranks = [p.ranks for p in points]
    if points:
        base = points[0]
        left.plot(ranks, measured, "o-", label="measured (median)" if
                  any(len(p.runs) > 1 for p in points) else "measured")
        spread = [(t - min(p.runs or [t]), max(p.runs or [t]) - t) for p, t in zip(points, measured)]
        left.errorbar(ranks, measured, yerr=list(zip(*spread)), fmt="none",
                      ecolor="tab:blue", capsize=4, alpha=0.6)
        left.plot(ranks, [measured[0] * r / base.ranks for r in ranks], "--", color="grey", label="linear")
        right.plot([r for r, _ in rated], [e for _, e in rated], "o-", color="tab:green")
        for r, e in rated:
            right.annotate(f"{e:.0f}%", (r, e), textcoords="offset points", xytext=(0, 6), ha="center")
    left.set(xlabel="ranks", ylabel="throughput (per second)", title="throughput")
    left.legend()
    top = max([110.0] + [e * 1.12 for _, e in rated])  # superlinear points stay visible
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
