"""A view as table rows of text: the nodes' table and each job's ranks (pure; the CLI draws them).

Each cell is (text, flag) where flag is "" or "outlier" / "warn" / "muted", for the renderer's colour.
"""

from __future__ import annotations

from typing import Any

Cell = tuple[str, str]
NODE_HEADER = ["NODE", "STATE", "GPU", "GPU MEM", "POWER", "TEMP", "CLOCKS", "CPU", "MEM", "RX", "TX", "DISK FREE"]
RANK_HEADER = ["RANK", "NODE", "STEP", "STEPS/S", "STEP TIME", "x MEDIAN", "LATE p99", "LAST OUTPUT", ""]
HARMLESS_REASONS = {"idle", "app_clocks", "display_clocks"}


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"  # pragma: no cover


def bits(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "-"
    b = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} bit/s"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.0f} min"


def gpu_cells(gpus: Any) -> list[Cell]:
    """GPU, GPU MEM, POWER, TEMP, CLOCKS: the node's GPUs together (mean, sums, worst)."""
    if gpus is None:
        return [("no GPU", "muted")] + [("", "")] * 4
    if isinstance(gpus, str):
        return [("…" if gpus == "starting" else gpus, "muted" if gpus == "starting" else "warn")] + [("", "")] * 4
    util = [g["util"] for g in gpus if g.get("util") is not None]
    used = sum(g.get("mem_used") or 0 for g in gpus)
    total = sum(g.get("mem_total") or 0 for g in gpus)
    power = sum(g.get("power") or 0 for g in gpus)
    temps = [g["temp"] for g in gpus if g.get("temp") is not None]
    reasons = sorted({r for g in gpus for r in (g.get("reasons") or []) if r not in HARMLESS_REASONS})
    mean = f"{sum(util) / len(util):.0f}%" if util else "-"
    return [(f"{len(gpus)}x {mean}", ""), (f"{size(used)} / {size(total)}", ""), (f"{power:.0f} W", ""),
            (f"{max(temps):.0f} C" if temps else "-", ""), (",".join(reasons) or "ok", "warn" if reasons else "")]


def link_share(row: dict[str, Any], key: str) -> str:
    rate = row.get(key)
    text = bits(rate)
    if rate is not None and row.get("link_bps"):
        text += f" ({100 * rate * 8 / row['link_bps']:.0f}%)"
    ratio = (row.get("net_ratio") or {}).get(key)
    if ratio is not None:
        text += f" x{ratio:.2f}"
    return text


def node_state(row: dict[str, Any]) -> Cell:
    if row["state"] != "ok":
        return (row["state"] + (f": {row['error']}" if row.get("error") else ""), "warn")
    if row.get("cordoned"):
        return ("cordoned", "warn")
    if row.get("net_outlier"):
        return ("net outlier", "outlier")
    return ("ok", "")


def node_row(row: dict[str, Any]) -> list[Cell]:
    cpu = row.get("cpu")
    mem = f"{size(row.get('mem_used'))} / {size(row.get('mem_total'))}" if row.get("mem_total") else "-"
    disk = row.get("disk") or {}
    free = size(disk.get("free")) if disk else "-"
    out = set(row.get("net_outlier") or [])
    return [(row["name"], ""), node_state(row), *gpu_cells(row.get("gpus")),
            ("-" if cpu is None else f"{cpu:.0f}%", ""), (mem, ""),
            (link_share(row, "rx"), "outlier" if "rx" in out else ""),
            (link_share(row, "tx"), "outlier" if "tx" in out else ""), (free, "")]


def rank_row(rank: dict[str, Any], late: set[str] | None = None) -> list[Cell]:
    """A rank's cells; ``late``: the nodes of workers the reducers flag (their ranks' LATE p99 in red)."""
    flag = "outlier" if rank.get("outlier") else ""
    us = rank.get("late_p99_us")
    late_cell = ("-" if us is None else seconds(us / 1e6), "outlier" if late and rank["node"] in late else "")
    note = "stalled" if rank.get("stalled") else "slow" if rank.get("outlier") else "ended" if rank.get("ended") else ""
    step = "-" if rank.get("step") is None else str(rank["step"]) + (f"/{rank['total']}" if rank.get("total") else "")
    rate = rank.get("rate")
    ratio = rank.get("ratio")
    return [(str(rank["rank"]), flag), (rank["node"], ""), (step, ""), ("-" if rate is None else f"{rate:.2f}", ""),
            (seconds(rank.get("step_time")), flag), ("-" if ratio is None else f"{ratio:.2f}", flag), late_cell,
            (seconds(rank.get("age")) + " ago" if rank.get("age") is not None else "-", ""), (note, flag)]


def late_nodes(job: dict[str, Any]) -> set[str]:
    """The nodes of the workers the reducers flag as stragglers."""
    return {w["node"] for w in (job.get("stragglers") or {}).get("workers", []) if w.get("flagged") and w.get("node")}


def late_words(w: dict[str, Any]) -> str:
    where = f" on {w['node']}" if w.get("node") else ""
    share = f", last in {100 * w['last_share']:.0f}% of requests" if w.get("last_share") is not None else ""
    return (f"worker {w['worker']}{where} made the others wait: p50 {seconds((w.get('p50_us') or 0) / 1e6)}, "
            f"p99 {seconds((w.get('p99_us') or 0) / 1e6)} late{share}")


def job_title(job: dict[str, Any]) -> str:
    parts = [f"job {job['id']}" + (f" ({job['name']})" if job.get("name") else ""), f"{len(job['ranks'])} rank(s)"]
    if job.get("median_rate") is not None:
        parts.append(f"median {job['median_rate']:.2f} steps/s")
    if job.get("median_step_time") is not None:
        parts.append(f"step {seconds(job['median_step_time'])}")
    if job.get("slowest"):
        parts.append("slowest: " + ", ".join(f"rank {r}" for r in job["slowest"]))
    if job.get("outliers"):
        parts.append("OUTLIERS: " + ", ".join(f"rank {r}" for r in job["outliers"]))
    late = [w for w in (job.get("stragglers") or {}).get("workers", []) if w.get("flagged")]
    if late:
        parts.append("STRAGGLERS: " + ", ".join(f"worker {w['worker']}" + (f" ({w['node']})" if w.get("node") else "")
                                                for w in late))
    return "; ".join(parts)


def ranks_shown(job: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The ranks to show first: outliers, then the slowest, then the rest by rank, at most ``limit``."""
    late = late_nodes(job)   # the ranks on a node the reducers flag come right after the outliers
    first = job.get("outliers", []) + [r["rank"] for r in job["ranks"] if r["node"] in late] + job.get("slowest", [])
    order: dict[int, int] = {}
    for i, r in enumerate(first):
        order.setdefault(r, i)
    ranks = sorted(job["ranks"], key=lambda r: (order.get(r["rank"], len(order)), r["rank"]))
    return ranks[:limit]


def summary_lines(view: dict[str, Any]) -> list[str]:
    """One line per outlier, in words (under the tables, and for --once without --json)."""
    lines = []
    for row in view["nodes"]:
        for d in row.get("net_outlier") or []:
            ratio = (row.get("net_ratio") or {}).get(d)
            lines.append(f"{row['name']}: network {d} at x{ratio:.2f} of the nodes' median" if ratio
                         else f"{row['name']}: network {d} off the median")
    for job in view["jobs"]:
        for rank in job["ranks"]:
            if rank.get("outlier"):
                what = "stalled" if rank.get("stalled") else f"step time x{rank.get('ratio') or 0:.2f} of the median"
                lines.append(f"job {job['id']}: rank {rank['rank']} on {rank['node']} {what}")
        for w in (job.get("stragglers") or {}).get("workers", []):
            if w.get("flagged"):
                lines.append(f"job {job['id']}: {late_words(w)}")
    return lines
