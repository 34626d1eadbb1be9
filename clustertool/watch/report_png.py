"""A run as a PNG: the same three panels and marks as the HTML page, drawn by matplotlib (Agg)."""

from __future__ import annotations

from pathlib import Path

from clustertool.bench.chart import pyplot
from clustertool.watch.report_html import MARK, PALETTE, PANELS
from clustertool.watch.runrecord import Run


def write(run: Run, path: str | Path) -> Path:
    """Three panels sharing the time axis (minutes); MissingPrerequisite without matplotlib."""
    plt = pyplot()
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(11, 9), sharex=True)
    minutes = [t / 60 for t in run.t]
    for ax, (key, what) in zip(axes, PANELS):
        values = {"gpu": run.gpu, "steps": run.steps, "net": run.net}[key]
        for i, node in enumerate(run.nodes):
            ys = [float("nan") if v is None else (v / 1e6 if key == "net" else v) for v in values.get(node, [])]
            ax.plot(minutes, ys, color=PALETTE[i % len(PALETTE)], linewidth=1.8, label=node if i < 12 else None)
        for e in run.events:
            if e.kind in ("restart", "cordon"):
                ax.axvline(e.t / 60, color=MARK[e.kind], linestyle="--", linewidth=1.5)
                ax.text(e.t / 60, ax.get_ylim()[1], e.label, color=MARK[e.kind], fontsize=7, va="top")
            elif (e.kind, key) in (("straggler", "steps"), ("network", "net")):
                ax.axvspan(e.t / 60, (e.end if e.end is not None else e.t) / 60 + 1e-3, color=MARK[e.kind],
                           alpha=0.25)
        title = (f"{run.utilisation} " + what) if key == "gpu" else what
        if key == "gpu" and run.utilisation == "CPU":
            title += ": no GPU on any node, CPU shown"
        ax.set_title(title.replace("(bit/s)", "(Mbit/s)"), fontsize=10, loc="left")
        if key == "gpu":
            ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1].set_xlabel("minutes since the first reading")
    fig.suptitle(f"job {run.job}" + (f" ({run.name})" if run.name else ""))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
