"""A job's watch record as series and events (pure): what `report` draws.

The record is ``~/.clustertool/jobs/<id>/watch/samples.jsonl`` on the leader (nodeprogs/watchrecord.py):
a header line, then per reading ``{"t", "nodes": {node: [gpu util, cpu, rx, tx, cordoned, reachable]},
"ranks": {rank: [node, step, rate, step time]}, "out": {"ranks": [...], "nodes": [...]}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clustertool.core.errors import StateError
from clustertool.core.model import jsonable


@dataclass
class Event:
    """A mark on the time axis: a restart or a cordon (at ``t``), a straggler or network outlier (``t`` to ``end``)."""

    kind: str  # restart | cordon | straggler | network
    t: float
    label: str
    end: float | None = None
    node: str | None = None


@dataclass
class Run:
    """A job's record as series: ``t`` (seconds since the first reading) and per node ``gpu``, ``steps``, ``net``."""

    job: str
    name: str | None
    start: float
    t: list[float] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    gpu: dict[str, list[float | None]] = field(default_factory=dict)
    steps: dict[str, list[float | None]] = field(default_factory=dict)
    net: dict[str, list[float | None]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    utilisation: str = "GPU"  # "CPU" when no node had a GPU (the panel then shows CPU, and says so)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def series(lines: list[dict[str, Any]], header: dict[str, Any]) -> Run:
    """Series and straggler/cordon events from a record's lines."""
    start = lines[0]["t"] if lines else float(header.get("since") or 0.0)
    run = Run(header.get("job", "?"), header.get("name"), start, nodes=[n for n, _ in header.get("nodes", [])])
    any_gpu = any(v[0] is not None for line in lines for v in line["nodes"].values())
    run.utilisation = "GPU" if any_gpu else "CPU"
    for n in run.nodes:
        run.gpu[n], run.steps[n], run.net[n] = [], [], []
    for line in lines:
        run.t.append(line["t"] - start)
        per_node: dict[str, list[float]] = {}
        for rank in line.get("ranks", {}).values():
            if rank[2] is not None:
                per_node.setdefault(rank[0], []).append(rank[2])
        for n in run.nodes:
            v = line["nodes"].get(n)
            run.gpu[n].append(None if v is None else (v[0] if any_gpu else v[1]))
            run.net[n].append(None if v is None or v[2] is None else 8.0 * (v[2] + (v[3] or 0)))
            run.steps[n].append(_mean(per_node.get(n, [])))
    run.events += cordons(lines, start) + spans(lines, start)
    return run


def cordons(lines: list[dict[str, Any]], start: float) -> list[Event]:
    """A node cordoned while the job ran (one cordoned before its first reading is not an event)."""
    out = []
    was = {n: bool(v[4]) for n, v in (lines[0]["nodes"].items() if lines else [])}
    for line in lines:
        for n, v in line["nodes"].items():
            if v[4] and not was.get(n, False):
                out.append(Event("cordon", line["t"] - start, f"cordon {n}", node=n))
            was[n] = bool(v[4])
    return out


def spans(lines: list[dict[str, Any]], start: float) -> list[Event]:
    """Stretches of readings where a rank was a straggler, or a node's network an outlier."""
    out: list[Event] = []
    open_: dict[tuple[str, str], Event] = {}
    for line in lines:
        t = line["t"] - start
        ranks = line.get("ranks", {})
        now = {("straggler", str(r)): f"straggler rank {r} ({ranks.get(str(r), ['?'])[0]})"
               for r in line.get("out", {}).get("ranks", [])}
        late = line.get("late") or {}
        now.update({("straggler", f"w{w}"): f"late worker {w} ({(late.get(w) or ['?'])[0]}) at the reducers"
                    for w in line.get("out", {}).get("late", [])})
        now.update({("network", n): f"network {n}" for n in line.get("out", {}).get("nodes", [])})
        for key in [k for k in open_ if k not in now]:
            out.append(open_.pop(key))
        for key, label in now.items():
            if key in open_:
                open_[key].end = t
            else:
                if key[0] == "straggler" and key[1].startswith("w"):  # a worker the reducers flagged: its node
                    node = (late.get(key[1][1:]) or [None])[0]
                else:
                    node = ranks.get(key[1], [None])[0] if key[0] == "straggler" else key[1]
                open_[key] = Event(key[0], t, label, end=t, node=node)
    return out + list(open_.values())


def restarts(attempts: dict[str, Any] | None, start: float) -> list[Event]:
    out = []
    for a in (attempts or {}).get("attempts") or []:
        if isinstance(a, dict) and (a.get("attempt") or 1) > 1 and a.get("start"):
            out.append(Event("restart", float(a["start"]) - start, f"restart {a['attempt'] - 1}"))
    return out


def load(text_by_file: dict[str, str], job_id: str) -> Run:
    """A Run from the leader's files (``samples`` must be there)."""
    text = text_by_file.get("watch/samples.jsonl")
    if not text:
        raise StateError(f"job {job_id} has no watch record on the leader",
                         hint="every job records its samples unless run with --no-record (a job started by an "
                              "older clustertool, or ended within its first seconds, has none); `clustertool top` "
                              "shows a running job live")
    docs = []
    for line in text.splitlines():
        try:
            docs.append(json.loads(line))
        except ValueError:
            continue  # a line cut short (the leader went down while writing)
    header = next((d["header"] for d in docs if "header" in d), {"job": job_id})
    run = series([d for d in docs if "t" in d and "nodes" in d], header)
    try:
        attempts = json.loads(text_by_file.get("attempts.json") or "null")
    except ValueError:
        attempts = None
    run.events += restarts(attempts, run.start)
    run.events.sort(key=lambda e: e.t)
    return run


