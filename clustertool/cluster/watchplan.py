"""What the watch hub on the leader is asked to do (its ARGS), made from the cluster's record: the plan that
`top` (watch/hub.py), the job recorder (jobs/launch.py) and the monitoring exporter (cluster/monitoring.py)
hand to ``nodeprogs/watchhub.py``.  It needs nothing above the cluster layer, so lifecycle can use it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.core.model import Node

MIN_INTERVAL = 0.2


@dataclass(frozen=True)
class WatchRequest:
    """What to watch: ``jobs`` (ids or names; empty: every running job), metric regexes, the pace."""

    jobs: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    interval: float = 1.0
    samples: int = 3  # --once: readings after the first answer of every node (an outlier needs 3 in a row)
    gpu: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.interval < MIN_INTERVAL:
            raise UsageError(f"--interval {self.interval}: at least {MIN_INTERVAL} s")
        if self.samples < 1:
            raise UsageError("--samples must be at least 1")
        for text in self.regex:
            check_regex(text)


def check_regex(text: str) -> None:
    """A --metric-regex must compile and name a ``step`` group (or match whole step lines)."""
    try:
        compiled = re.compile(text)
    except re.error as exc:
        example = "'step (?P<step>\\d+) .*time (?P<time>[\\d.]+)(?P<unit>ms)'"
        raise UsageError(f"--metric-regex {text!r}: {exc}", hint=f"a Python regex, e.g. {example}") from None
    unknown = set(compiled.groupindex) - {"step", "total", "time", "unit", "loss", "rate", "rate_unit"}
    if unknown:
        raise UsageError(f"--metric-regex {text!r}: unknown group(s) {', '.join(sorted(unknown))}",
                         hint="groups: step, total, time, unit, loss, rate, rate_unit")


def hub_args(session: ClusterSession, mode: str, request: WatchRequest, jobs: list[str] | None,
             nodes: Sequence[Node] | None = None) -> dict[str, Any]:
    """The hub's ARGS: the nodes (name, private address, role; default every node), the leader, what to watch,
    and the links' rate the provider shaped them to (bits/s; the local provider's --link-rate), if any."""
    record = session.record
    watched = record.ordered_nodes() if nodes is None else list(nodes)
    return dict({"mode": mode, "leader": record.leader.name,
                 "nodes": [[n.name, n.address, n.role] for n in watched],
                 "node_source": nodeprogs.program_source("watchnode"), "remote_python": nodeprogs.stream_command(),
                 "interval": request.interval, "samples": request.samples, "jobs": jobs,
                 "regex": list(request.regex), "gpu": request.gpu,
                 "link_bps": session.provider.link_rate(record),
                 "cordoned": [n.name for n in record.nodes if n.cordoned]}, **request.extra)
