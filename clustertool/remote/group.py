"""Run one command on many nodes at once; every node's outcome is a value.

Each node gets its own ssh process; output is read line by line as it comes and handed to
``on_line`` (for live, prefixed display); a node that hangs is killed at ``timeout`` and
reported, never holding the others up.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Sequence

from clustertool.core.model import GroupResult, HostResult, Node
from clustertool.remote.transport import Link, NodeProcess, classify_ssh_failure, stop_process

LineCallback = Callable[[str, str, str], None]  # (node name, "stdout"|"stderr", line)
CommandFor = Callable[[Node], str]


@dataclass
class _Running:
    node: Node
    proc: NodeProcess
    started: float
    out: list[str]
    err: list[str]
    timed_out: bool = False
    pumps: tuple[threading.Thread, ...] = ()


def _pump(stream: IO[bytes], sink: list[str], node: str, kind: str, on_line: LineCallback | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sink.append(line)
        if on_line is not None:
            on_line(node, kind, line.rstrip("\n"))
    stream.close()


def _result(run: _Running) -> HostResult:
    duration = time.monotonic() - run.started
    stdout, stderr = "".join(run.out), "".join(run.err)
    code = run.proc.returncode
    if run.timed_out:
        return HostResult(run.node.name, None, stdout, stderr, duration, "timed out")
    error = classify_ssh_failure(stderr) if code == 255 else None
    return HostResult(run.node.name, code, stdout, stderr, duration, error)


def run_on_nodes(
    link: Link,
    nodes: Iterable[Node],
    command: str | CommandFor,
    *,
    timeout: float | None = None,
    on_line: LineCallback | None = None,
    stdin_data: bytes | Callable[[Node], bytes] | None = None,
    ssh_extra: list[str] | None = None,
) -> GroupResult:
    """Run ``command`` (a remote shell line, or a function of the node) on every node.

    ``stdin_data`` (bytes, or a function of the node) is written to the command's stdin.
    """
    nodes = list(nodes)
    runs: list[_Running] = []
    try:
        for node in nodes:
            line = command(node) if callable(command) else command
            data = stdin_data(node) if callable(stdin_data) else stdin_data
            # the clock starts before the spawn: the command may be running on the node (its own timeout(1)
            # counting, see remote/execute.py) before this thread runs again, on a loaded machine
            started = time.monotonic()
            proc = link.spawn(node, line, data, extra=ssh_extra)
            run = _Running(node, proc, started, [], [])
            runs.append(run)
            pumps = []
            for stream, sink, kind in ((proc.stdout, run.out, "stdout"), (proc.stderr, run.err, "stderr")):
                t = threading.Thread(target=_pump, args=(stream, sink, node.name, kind, on_line), daemon=True)
                t.start()
                pumps.append(t)
            run.pumps = tuple(pumps)
            if data is not None:
                threading.Thread(target=_feed, args=(proc, data), daemon=True).start()
        wait_all(runs, timeout)
        drain(runs)
    except BaseException:
        for run in runs:
            stop_process(run.proc)
        raise
    return GroupResult([_result(r) for r in runs])


def _feed(proc: NodeProcess, data: bytes) -> None:
    assert proc.stdin is not None  # spawned with stdin=PIPE
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def wait_all(runs: Sequence[Any], timeout: float | None) -> None:
    """Wait for each ``run.proc`` until one shared deadline; a process still going then is stopped
    and its ``run.timed_out`` set (the others are not held up by it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for run in runs:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            run.proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            stop_process(run.proc)
            run.proc.wait()


OUTPUT_GRACE_S = 5.0  # how long the output of commands that ended may take to reach us, all together


def drain(runs: Sequence[_Running]) -> None:
    """Let the output of the commands that ended arrive (one shared grace, not one per stream).

    A timed-out command's output is not waited for: what keeps its streams open (a process it left
    behind; the master connection's session, which lasts as long as the command on the node) is what
    the timeout was about.  Its result holds the lines that came before the deadline."""
    deadline = time.monotonic() + OUTPUT_GRACE_S
    for run in runs:
        if run.timed_out:
            continue
        for pump in run.pumps:
            pump.join(timeout=max(0.0, deadline - time.monotonic()))


def run_on_node(link: Link, node: Node, command: str, *, timeout: float | None = None,
                on_line: LineCallback | None = None, stdin_data: bytes | Callable[[Node], bytes] | None = None,
                ssh_extra: list[str] | None = None) -> HostResult:
    return run_on_nodes(link, [node], command, timeout=timeout, on_line=on_line, stdin_data=stdin_data,
                        ssh_extra=ssh_extra).results[0]
