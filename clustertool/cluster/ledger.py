"""The cost ledger: one JSON line per lifecycle event of every cluster this home made.

``$CLUSTERTOOL_HOME/ledger.jsonl`` gets a line at ``up``, ``stop``, ``start``, ``down`` and when a
command finds that the cluster's own watcher stopped (``autostop``) or terminated (``autodown``)
it.  It is never rewritten, so a cluster that is long gone is still counted.  ``summarize``
(pure) turns the lines into hours up, hours stopped, hours autostop saved and an estimated cost
from the same price table `up` shows.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from clustertool.core import state
from clustertool.core.model import ClusterRecord, ClusterState
from clustertool.providers.base import REGISTRY, provider_class

RUNNING_FROM = ("up", "start")
STOPPED_FROM = ("stop", "autostop")
GONE_AT = ("down", "autodown")
PURCHASE = "purchase"  # money spent upfront (a Capacity Block): {"usd", "what"}, counted once, never hourly
EVENTS = RUNNING_FROM + STOPPED_FROM + GONE_AT + (PURCHASE,)


def path() -> Path:
    return state.home() / "ledger.jsonl"


def node_type(cluster: ClusterRecord) -> str:
    """What one node is, for pricing: the instance type, else the provider."""
    return cluster.provider_state.get("instance_type") or cluster.options.get("instance_type") or cluster.provider


def event_of(event: str, cluster: ClusterRecord, t: float | None = None, **extra: object) -> dict:
    if event not in EVENTS:
        raise ValueError(f"unknown ledger event {event!r}")
    prepaid = cluster.provider_state.get("prepaid")  # e.g. "capacity block cr-…": its hours cost nothing more
    storage = cluster.provider_state.get("shared_fs_hourly")  # file systems `up` made (AWS: FSx, EFS throughput)
    return {"t": time.time() if t is None else t, "event": event, "id": cluster.id or cluster.name,
            "name": cluster.name, "provider": cluster.provider, "type": node_type(cluster),
            "nodes": len(cluster.nodes), "spot": bool(cluster.options.get("spot")),
            **({"prepaid": prepaid} if prepaid else {}), **({"storage_hourly": storage} if storage else {}), **extra}


def record(event: str, cluster: ClusterRecord, t: float | None = None, **extra: object) -> dict:
    """Append one event (never fails the command that records it: a ledger that cannot be written
    costs the figures, not the cluster)."""
    return _append(event_of(event, cluster, t, **extra))


def record_purchase(purchase_id: str, what: str, usd: float, provider: str, node_type: str, nodes: int,
                    t: float | None = None) -> dict:
    """Money spent upfront (`capacity buy`): one line, counted as spent once (the ``cost`` report)."""
    return _append({"t": time.time() if t is None else t, "event": PURCHASE, "id": purchase_id, "name": what,
                    "provider": provider, "type": node_type, "nodes": nodes, "usd": float(usd)})


def record_gone(name: str, cluster_id: str) -> dict:
    """A cluster a sweep removed after its state was lost: only its id and name are known."""
    return _append({"t": time.time(), "event": "down", "id": cluster_id, "name": name})


def _append(line: dict) -> dict:
    try:
        target = path()
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        pass
    return line


def read() -> list[dict]:
    try:
        text = path().read_text()
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in EVENTS and isinstance(event.get("t"), (int, float)):
            events.append(event)
    return events


@dataclass
class ClusterCost:
    id: str
    name: str
    provider: str
    type: str
    nodes: int
    state: str  # running | stopped | autostopped | down | autodowned
    created: float
    hours_up: float = 0.0
    hours_stopped: float = 0.0
    hours_saved: float = 0.0  # stopped or gone by autostop, until the next start/down (or now)
    hourly: float | None = None  # USD per hour for all nodes; None when unknown
    spot: bool = False
    notes: list[str] = field(default_factory=list)
    spent: float = 0.0  # USD paid upfront (a purchase); its hours cost nothing more
    prepaid: str | None = None  # the cluster ran on capacity paid upfront (e.g. "capacity block cr-…")
    storage_hourly: float = 0.0  # USD per hour of shared filesystems it made: billed while up and while stopped

    @property
    def cost(self) -> float | None:
        storage = (self.hours_up + self.hours_stopped) * self.storage_hourly
        return None if self.hourly is None else self.spent + self.hours_up * self.hourly + storage

    @property
    def saved(self) -> float | None:
        return None if self.hourly is None else self.hours_saved * self.hourly

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(cost_usd=_round(self.cost), saved_usd=_round(self.saved), hourly_usd=_round(self.hourly))
        del out["hourly"]
        for key in ("hours_up", "hours_stopped", "hours_saved"):
            out[key] = round(out[key], 4)
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def hourly_price(provider: str, node_type: str, nodes: int, spot: bool) -> float | None:
    """USD per hour for the cluster: the price table `up` uses (approximate); local nodes cost nothing."""
    if provider not in REGISTRY:
        return None  # a provider this version does not know (a ledger written by another one)
    return provider_class(provider).hourly_price(node_type, nodes, spot)


def _span(start: float, end: float, since: float) -> float:
    return max(0.0, end - max(start, since)) / 3600.0


def summarize(events: list[dict], now: float | None = None, since: float = 0.0) -> list[ClusterCost]:
    """Per cluster (by id, oldest first): hours up / stopped / saved by autostop from ``since`` to
    ``now``.  A cluster's last known state lasts until now (a live cluster keeps counting)."""
    now = time.time() if now is None else now
    out: dict[str, ClusterCost] = {}
    mode: dict[str, tuple[str, float]] = {}  # id -> (running|stopped|gone, since)
    saving: dict[str, float] = {}  # id -> when autostop/autodown began saving
    for e in sorted(events, key=lambda e: e["t"]):
        cid, t, kind = e.get("id") or e.get("name", "?"), float(e["t"]), e["event"]
        c = out.get(cid)
        if c is None and kind in GONE_AT:
            continue  # removed, but never seen alive (made before the ledger): nothing to count
        if kind == PURCHASE:
            out[cid] = _purchase(e, cid, t)
            continue
        if c is None:
            c = out[cid] = ClusterCost(cid, e.get("name", cid), e.get("provider", "?"), e.get("type", "?"),
                                       int(e.get("nodes") or 0), "running", t, spot=bool(e.get("spot")))
        if e.get("nodes"):
            c.nodes = int(e["nodes"])
        c.prepaid = e.get("prepaid") or c.prepaid
        c.storage_hourly = float(e.get("storage_hourly") or c.storage_hourly)
        _close(c, mode.get(cid), t, since)
        if cid in saving and kind in ("start", "down", "stop"):
            c.hours_saved += _span(saving.pop(cid), t, since)
        if kind in RUNNING_FROM:
            mode[cid], c.state = ("running", t), "running"
        elif kind in STOPPED_FROM:
            mode[cid], c.state = ("stopped", t), "autostopped" if kind == "autostop" else "stopped"
        else:
            mode[cid], c.state = ("gone", t), "autodowned" if kind == "autodown" else "down"
        if kind in ("autostop", "autodown"):
            saving[cid] = t
    for cid, c in out.items():
        if c.state == PURCHASE:
            continue
        _close(c, mode.get(cid), now, since)
        if cid in saving:
            c.hours_saved += _span(saving[cid], now, since)
        c.hourly = 0.0 if c.prepaid else hourly_price(c.provider, c.type, c.nodes, c.spot)
        if c.prepaid:
            c.notes.append(f"prepaid: {c.prepaid} " + ("(its fee is counted once, as a purchase)"
                                                       if c.prepaid.startswith("capacity block") else
                                                       "(the reservation bills by itself, used or not)"))
        if c.hourly is None:
            c.notes.append("spot price not recorded" if c.spot else f"no price known for {c.type}")
        if c.storage_hourly:
            c.notes.append(f"includes shared filesystems at ${c.storage_hourly:,.4f}/h, up or stopped")
    live_since = [c for c in out.values() if c.state not in ("down", "autodowned", PURCHASE)
                  or _ended_after(c, mode, since)]
    return sorted(live_since, key=lambda c: c.created)


def _ended_after(c: ClusterCost, mode: dict, since: float) -> bool:
    if c.state == PURCHASE:
        return c.created >= since
    return mode[c.id][1] >= since


def _purchase(e: dict, cid: str, t: float) -> ClusterCost:
    """A purchase as a row of its own: state "purchase", its fee spent at ``t``, no hours."""
    return ClusterCost(cid, e.get("name", cid), e.get("provider", "?"), e.get("type", "?"), int(e.get("nodes") or 0),
                       PURCHASE, t, hourly=0.0, spent=float(e.get("usd") or 0.0))


def _close(c: ClusterCost, current: tuple[str, float] | None, t: float, since: float) -> None:
    if current is None:
        return
    kind, start = current
    if kind == "running":
        c.hours_up += _span(start, t, since)
    elif kind == "stopped":
        c.hours_stopped += _span(start, t, since)


@dataclass
class CostReport:
    clusters: list[ClusterCost]
    since: float | None

    @property
    def total(self) -> float:
        return sum(c.cost or 0.0 for c in self.clusters)

    @property
    def total_saved(self) -> float:
        return sum(c.saved or 0.0 for c in self.clusters)

    def to_dict(self) -> dict:
        return {"clusters": [c.to_dict() for c in self.clusters], "since": self.since,
                "total_usd": round(self.total, 2), "saved_usd": round(self.total_saved, 2),
                "approximate": True, "basis": basis()}


def basis() -> str:
    return ("instance hours x an approximate us-east-1 on-demand price table (the one `up` shows); "
            "stopped hours cost only their disks, which are not counted; local nodes cost nothing")


def report(since: float | None = None, now: float | None = None, known: Sequence[ClusterRecord] = ()) -> CostReport:
    """The ledger's clusters; ``known`` clusters (state files) it has never seen -- made before the
    ledger existed -- count from their creation, in their recorded state."""
    events = read()
    seen = {e.get("id") for e in events}
    for cluster in known:
        unfinished = cluster.status in (ClusterState.PROVISIONING, ClusterState.FAILED)
        if (cluster.id or cluster.name) in seen or not cluster.created or unfinished:
            continue
        events.append(event_of("up", cluster, t=cluster.created))
        if cluster.status in (ClusterState.STOPPED, ClusterState.AUTOSTOPPED):
            events.append(event_of("stop", cluster, t=now if now is not None else time.time()))
    return CostReport(summarize(events, now=now, since=since or 0.0), since)
