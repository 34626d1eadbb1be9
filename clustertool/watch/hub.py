"""`top`'s collection: the watch hub on the leader, reached over ONE ssh session from this machine.

The hub (``nodeprogs/watchhub.py``) runs a sampler on every node over the cluster's own ssh mesh and
says one view per reading; this side starts it (``stream`` for the live view, ``once`` for
``--once``), reads the views and adds what only this machine knows: the cluster's name and the
link rate the provider recorded.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import RemoteError, UsageError
from clustertool.core.model import ClusterRecord
from clustertool.jobs import records
from clustertool.remote.transport import classify_ssh_failure, stop_process

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


def resolve_jobs(session: ClusterSession, refs: tuple[str, ...]) -> list[str] | None:
    """Job ids for ``--job`` (ids, prefixes or names this machine knows); None: every running job."""
    if not refs:
        return None
    known = records.load_all(session.name)
    return [records.resolve(known, ref).id for ref in refs]


def hub_args(session: ClusterSession, mode: str, request: WatchRequest, jobs: list[str] | None) -> dict[str, Any]:
    """The hub's ARGS: every node (name, private address, role), the leader, what to watch, and the links'
    rate the provider shaped them to (bits/s; the local provider's --link-rate), if any."""
    record = session.record
    return dict({"mode": mode, "leader": record.leader.name,
                 "nodes": [[n.name, n.address, n.role] for n in record.ordered_nodes()],
                 "node_source": nodeprogs.program_source("watchnode"), "remote_python": nodeprogs.stream_command(),
                 "interval": request.interval, "samples": request.samples, "jobs": jobs,
                 "regex": list(request.regex), "gpu": request.gpu,
                 "link_bps": session.provider.link_rate(record),
                 "cordoned": [n.name for n in record.nodes if n.cordoned]}, **request.extra)


def decorate(view: dict[str, Any], record: ClusterRecord) -> dict[str, Any]:
    view["cluster"] = record.name
    return view


class HubStream:
    """The hub in ``stream`` mode: views as they come, until closed (then nothing stays on any node)."""

    def __init__(self, session: ClusterSession, request: WatchRequest, jobs: list[str] | None, mode: str = "stream"):
        self.session = session
        record = session.ready()
        data = nodeprogs.program_stream("watchhub", hub_args(session, mode, request, jobs))
        self.proc = session.spawn(record.leader, nodeprogs.stream_command(), data)
        self.stderr: list[str] = []
        threading.Thread(target=self._feed, args=(data,), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None   # spawned with pipes
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            self.stderr.append(raw.decode("utf-8", "replace"))

    def views(self) -> Iterator[dict[str, Any]]:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            try:
                view = json.loads(raw)
            except ValueError:
                continue
            if isinstance(view, dict) and "nodes" in view:
                yield decorate(view, self.session.record)
        self.proc.wait()
        raise self.failure()

    def failure(self) -> RemoteError:
        text = "".join(self.stderr).strip()
        why = classify_ssh_failure(text) if self.proc.returncode == 255 else None
        last = text.splitlines()[-1] if text else f"exit {self.proc.returncode}"
        return RemoteError(f"the watch on the leader ended: {why or last}",
                           hint="check the leader with `clustertool exec --nodes leader -- true`")

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=10)
        except Exception:  # a hung session: stop it (its sampler ends with its stdin)
            stop_process(self.proc)

    def __enter__(self) -> "HubStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def snapshot(session: ClusterSession, request: WatchRequest) -> dict[str, Any]:
    """`top --once`: one view after ``request.samples`` readings."""
    jobs = resolve_jobs(session, request.jobs)
    with HubStream(session, request, jobs, mode="once") as hub:
        for view in hub.views():
            return view
    raise RemoteError("the watch on the leader said nothing")  # pragma: no cover - views() raises first


def stream(session: ClusterSession, request: WatchRequest) -> HubStream:
    """`top`: the live stream (a context manager; ``views()`` yields each reading)."""
    return HubStream(session, request, resolve_jobs(session, request.jobs))
