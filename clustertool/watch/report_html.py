"""A run as one self-contained HTML page: three SVG panels drawn here (no script, no file beside it).

Panels, one above the other, each ``WIDTH`` x ``PANEL_H`` CSS pixels below a ``HEADER_H`` header (the
tests look at a browser's picture of them by these numbers): GPU utilisation (CPU where no node had a
GPU, and the title says so), step rate, network (rx + tx), one line per node in ``PALETTE`` order.
Restarts (red) and cordons (purple) are dashed vertical lines across every panel; stragglers are orange
bands on the step-rate panel, network outliers on the network panel.
"""

from __future__ import annotations

import html
import time
from typing import Callable

from clustertool.watch.runrecord import Event, Run

WIDTH, PANEL_H, HEADER_H, GAP = 1100, 240, 80, 16
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 30, 30
PALETTE = ("#1f77b4", "#2ca02c", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79")
MARK = {"restart": "#d62728", "cordon": "#9467bd", "straggler": "#ff7f0e", "network": "#ff7f0e"}
BAND_OPACITY = 0.25
LEGEND_MAX = 12
PANELS = (("gpu", "utilisation (%)"), ("steps", "step rate (steps/s, mean of the node's ranks)"),
          ("net", "network rx + tx (bit/s)"))


def panel_top(i: int) -> int:
    """The y (CSS px from the page's top) where panel ``i`` starts."""
    return HEADER_H + i * (PANEL_H + GAP)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _scale(run: Run, values: dict[str, list[float | None]],
           fixed_top: float | None) -> tuple[Callable[[float], float], Callable[[float], float], float, float]:
    t_end = max(run.t[-1] if run.t else 1.0, 1.0)
    top = fixed_top or max([v for vs in values.values() for v in vs if v is not None] + [0.0]) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PANEL_H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * max(0.0, min(t, t_end)) / t_end

    def y(v: float) -> float:
        return TOP + plot_h * (1.0 - min(v, top) / top)

    return x, y, top, t_end


def _fmt(v: float, key: str) -> str:
    if key == "net" and v > 0:
        return f"{v / 1e9:.1f}G" if v >= 1e9 else f"{v / 1e6:.0f}M" if v >= 1e6 else f"{v / 1e3:.0f}k"
    return f"{v:.0f}" if v >= 10 or v == 0 else f"{v:.1f}"


def _axes(x: Callable[[float], float], y: Callable[[float], float], top: float, t_end: float, key: str) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL_H - TOP - BOTTOM}" '
           f'fill="none" stroke="#bbbbbb"/>']
    for k in range(5):
        v = top * k / 4
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">{_fmt(v, key)}</text>')
    for k in range(6):
        t = t_end * k / 5
        label = f"{t:.0f} s" if t_end < 180 else f"{t / 60:.1f} min" if t_end < 36000 else f"{t / 3600:.1f} h"
        out.append(f'<text x="{x(t):.1f}" y="{PANEL_H - 10}" text-anchor="middle" font-size="11">{label}</text>')
    return out


def _lines(run: Run, values: dict[str, list[float | None]], x: Callable[[float], float],
           y: Callable[[float], float]) -> list[str]:
    out = []
    for i, node in enumerate(run.nodes):
        segment: list[str] = []
        for t, v in zip(run.t, values.get(node, [])):
            if v is None:
                if len(segment) > 1:
                    out.append(_polyline(segment, color(i)))
                segment = []
                continue
            segment.append(f"{x(t):.1f},{y(v):.1f}")
        if len(segment) > 1:
            out.append(_polyline(segment, color(i)))
    return out


def _polyline(points: list[str], stroke: str) -> str:
    return f'<polyline points="{" ".join(points)}" fill="none" stroke="{stroke}" stroke-width="2.5"/>'


def _legend(run: Run) -> list[str]:
    out = []
    for i, node in enumerate(run.nodes[:LEGEND_MAX]):
        yy = TOP + 14 * i + 6
        out.append(f'<line x1="{WIDTH - RIGHT + 12}" y1="{yy}" x2="{WIDTH - RIGHT + 32}" y2="{yy}" '
                   f'stroke="{color(i)}" stroke-width="3"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 38}" y="{yy + 4}" font-size="11">{_esc(node)}</text>')
    if len(run.nodes) > LEGEND_MAX:
        out.append(f'<text x="{WIDTH - RIGHT + 12}" y="{TOP + 14 * LEGEND_MAX + 10}" font-size="11">'
                   f'… {len(run.nodes) - LEGEND_MAX} more</text>')
    return out


def _marks(events: list[Event], key: str, x: Callable[[float], float]) -> list[str]:
    out = []
    for e in events:
        if e.kind in ("restart", "cordon"):
            xx = x(e.t)
            out.append(f'<line class="mark-{e.kind}" x1="{xx:.1f}" y1="{TOP}" x2="{xx:.1f}" y2="{PANEL_H - BOTTOM}" '
                       f'stroke="{MARK[e.kind]}" stroke-width="2" stroke-dasharray="6,4"/>')
            out.append(f'<text x="{xx + 3:.1f}" y="{TOP + 12}" font-size="10" fill="{MARK[e.kind]}">'
                       f'{_esc(e.label)}</text>')
        elif (e.kind, key) in (("straggler", "steps"), ("network", "net")):
            x0, x1 = x(e.t), x(e.end if e.end is not None else e.t)
            out.append(f'<rect class="mark-{e.kind}" x="{x0:.1f}" y="{TOP}" width="{max(4.0, x1 - x0):.1f}" '
                       f'height="{PANEL_H - TOP - BOTTOM}" fill="{MARK[e.kind]}" fill-opacity="{BAND_OPACITY}"/>')
            out.append(f'<text x="{x0 + 3:.1f}" y="{PANEL_H - BOTTOM - 6}" font-size="10" fill="#a05000">'
                       f'{_esc(e.label)}</text>')
    return out


def panel(run: Run, i: int) -> str:
    key, what = PANELS[i]
    values = {"gpu": run.gpu, "steps": run.steps, "net": run.net}[key]
    title = (f"{run.utilisation} " + what if key == "gpu" else what)
    if key == "gpu" and run.utilisation == "CPU":
        title += ": no GPU on any node, CPU shown"
    x, y, top, t_end = _scale(run, values, 100.0 if key == "gpu" else None)
    body = _axes(x, y, top, t_end, key) + _marks(run.events, key, x) + _lines(run, values, x, y) + _legend(run)
    return (f'<svg id="panel-{key}" class="panel" width="{WIDTH}" height="{PANEL_H}" '
            f'viewBox="0 0 {WIDTH} {PANEL_H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">'
            f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{_esc(title)}</text>'
            + "".join(body) + "</svg>")


def _events_table(run: Run) -> str:
    if not run.events:
        return "<p>No restart, cordon, straggler or network outlier while the job was recorded.</p>"
    rows = "".join(f"<tr><td>{e.t / 60:.1f} min</td><td>{_esc(e.kind)}</td><td>{_esc(e.label)}</td>"
                   f"<td>{'' if e.end is None else f'{(e.end - e.t):.0f} s'}</td></tr>" for e in run.events)
    return f"<table><tr><th>at</th><th>what</th><th></th><th>for</th></tr>{rows}</table>"


def page(run: Run) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run.start)) if run.start else "?"
    length = run.t[-1] / 60 if run.t else 0.0
    title = f"job {run.job}" + (f" ({run.name})" if run.name else "")
    head = (f'<div id="header" style="height:{HEADER_H}px;box-sizing:border-box;padding:10px {LEFT}px">'
            f'<h1 style="font-size:20px;margin:0 0 6px 0">{_esc(title)}</h1>'
            f'<div>{len(run.nodes)} node(s), {len(run.t)} readings from {started}, {length:.1f} min; '
            f'<span style="color:{MARK["restart"]}">restarts</span>, '
            f'<span style="color:{MARK["cordon"]}">cordons</span>, '
            f'<span style="color:#c06000">stragglers and network outliers</span> marked</div></div>')
    panels = "".join(f'<div style="height:{PANEL_H + GAP}px">{panel(run, i)}</div>' for i in range(len(PANELS)))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}: clustertool report</title>"
            "<style>body{margin:0;background:#ffffff;font-family:sans-serif;font-size:13px}"
            "svg{display:block}table{margin:0 70px 20px;border-collapse:collapse}"
            "td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}</style></head>"
            f"<body>{head}{panels}{_events_table(run)}</body></html>\n")
