"""Per-node transfer progress (bytes, rate, ETA) and the per-node verification table.

Kept apart from render.py (tables, JSON); rich is imported lazily.  ``NodeProgress.update`` is safe to call
from the core's reader threads.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Sequence

from clustertool.cli import render
from clustertool.core.words import counted

if TYPE_CHECKING:
    from rich.progress import Progress

    from clustertool.transfer.results import CopyResult
    from clustertool.transfer.s3 import SyncResult


class NodeProgress:
    """A rich progress display with one bar per node; a no-op when disabled or not a tty."""

    def __init__(self, nodes: Sequence[str], enabled: bool = True):
        self.enabled = enabled and sys.stderr.isatty()
        self._nodes = list(nodes)
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._progress: Progress | None = None

    def __enter__(self) -> "NodeProgress":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=False, refresh_per_second=4)
        self._progress.__enter__()
        for name in self._nodes:
            self._tasks[name] = self._progress.add_task(name, total=None, start=False)
        return self

    def update(self, node: str, done: int, total: int | None) -> None:
        if self._progress is None:
            return
        with self._lock:
            task = self._tasks.get(node)
            if task is None:
                task = self._tasks[node] = self._progress.add_task(node, total=None, start=False)
            self._progress.start_task(task)
            self._progress.update(task, completed=done, total=total or None)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def copy_table(result: CopyResult) -> None:
    """One row per node: verdict, bytes received, files sent/checked, the error if any."""
    rows = []
    for n in result.nodes:
        judged = result.verified and n.status in ("ok", "mismatch")  # a failed node's files were not verified
        rows.append([n.node, n.status, human_bytes(n.bytes_received), n.files_sent,
                     n.files_checked if judged else "-", n.exit_code, render.clip(n.error or "")])
    for line in getattr(result, "source_errors", [])[:10]:
        sys.stderr.write(f"source: {line}\n")
    render.table(["node", "status", "received", "files sent", "verified files", "exit", "error"], rows,
                 title=f"{result.strategy}: {result.src} -> {result.dest} (from {result.source})")


def copy_summary(result: CopyResult) -> str:
    ok = sum(1 for n in result.nodes if n.status == "ok")
    rate = result.bytes_sent / result.duration if result.duration > 0 else 0.0
    return (f"{ok}/{len(result.nodes)} ok; {human_bytes(result.bytes_sent)} sent for a "
            f"{human_bytes(result.total_bytes)} source ({counted(result.total_files, 'file')}) in "
            f"{result.duration:.1f}s ({human_bytes(int(rate))}/s), {counted(result.passes, 'pass', 'passes')}"
            + (_verify_note(result) if result.verified else "; not verified"))


def _verify_note(result: CopyResult) -> str:
    streamed = sum(n.files_verified_in_stream for n in result.nodes)
    checked = sum(n.files_checked for n in result.nodes)
    if result.verify == "reread":
        return f"; verified by re-reading ({result.hash})"
    return f"; verified ({result.hash}): {streamed} of {checked} file checks in the stream, the rest re-read"


def mismatch_lines(result: CopyResult, limit: int = 10) -> list[str]:
    """The files a mismatching node got wrong, for stderr."""
    lines = []
    for n in result.nodes:
        if n.error and render.clip(n.error) != n.error:
            lines.append(f"{n.node}: {n.error}")
        for problem in n.problems[:limit]:
            lines.append(f"{n.node}: {problem}")
        if len(n.problems) > limit:
            lines.append(f"{n.node}: ... and {len(n.problems) - limit} more")
    return lines


def sync_table(result: SyncResult) -> None:
    """One row per node: its objects, what was fetched and verified, the error if any (details on stderr)."""
    rows = [[n.node, n.status, n.objects, n.up_to_date, n.downloaded, human_bytes(n.bytes_downloaded),
             f"{n.verified}" + (f" +{n.size_only} by size" if n.size_only else ""), render.clip(n.error or "", 40)]
            for n in result.nodes]
    render.table(["node", "status", "objects", "up to date", "fetched", "bytes", "verified", "error"], rows,
                 title=f"sync-s3 {result.url} -> {result.dest}" + (" (sharded)" if result.shard else ""))
    for n in result.nodes:
        for line in ([n.error] if n.error and render.clip(n.error, 40) != n.error else []) + n.errors[:10]:
            sys.stderr.write(f"{n.node}: {line}\n")
        if len(n.errors) > 10:
            sys.stderr.write(f"{n.node}: ... and {len(n.errors) - 10} more\n")
    for key in result.skipped_keys[:10]:
        sys.stderr.write(f"skipped (no safe local name): {key!r}\n")


def sync_summary(result: SyncResult) -> str:
    ok = sum(1 for n in result.nodes if n.status == "ok")
    rate = result.bytes_downloaded / result.duration if result.duration > 0 else 0.0
    renewals = sum(n.renewals for n in result.nodes)
    return (f"{ok}/{len(result.nodes)} ok; {result.objects} object(s), {human_bytes(result.total_bytes)} listed; "
            f"{human_bytes(result.bytes_downloaded)} downloaded in {result.duration:.1f}s "
            f"({human_bytes(int(rate))}/s over all nodes)"
            + (f"; expired URLs renewed {renewals} time(s)" if renewals else ""))
