"""`top`'s collection: the watch hub on the leader, reached over ONE ssh session from this machine.

The hub (``nodeprogs/watchhub.py``) runs a sampler on every node over the cluster's own ssh mesh and
says one view per reading; this side starts it (``stream`` for the live view, ``once`` for
``--once``), reads the views and adds what only this machine knows: the cluster's name and the
link rate the provider recorded.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.watchplan import WatchRequest, hub_args
from clustertool.core.errors import RemoteError
from clustertool.core.model import ClusterRecord
from clustertool.jobs import records
from clustertool.remote.transport import classify_ssh_failure, stop_process

__all__ = ["WatchRequest", "HubStream", "resolve_jobs", "snapshot", "stream"]


def resolve_jobs(session: ClusterSession, refs: tuple[str, ...]) -> list[str] | None:
    """Job ids for ``--job`` (ids, prefixes or names this machine knows); None: every running job."""
    if not refs:
        return None
    known = records.load_all(session.name)
    return [records.resolve(known, ref).id for ref in refs]


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
