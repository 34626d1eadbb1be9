"""Conversations with a program on many nodes at once: JSON lines both ways over each node's ssh.

``run_on_nodes`` writes a node's stdin once and closes it.  A program that needs answers while it
runs (sync-s3's nodes ask for presigned URLs, and for fresh ones when those expire) gets a session
instead: stdin stays open after the ``opening`` bytes, every JSON object the program prints on a
line of its own goes to ``on_message(node, message, reply)``, and ``reply(obj)`` writes one JSON
line back to that node.  Other stdout lines are kept as the node's stdout.  Every node's outcome
is a ``HostResult``, as with ``run_on_nodes``; a node that hangs is killed at ``timeout``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable, Iterable

from clustertool.core.model import GroupResult, HostResult, Node
from clustertool.remote.group import wait_all
from clustertool.remote.transport import Link, NodeProcess, classify_ssh_failure, stop_process

Reply = Callable[[dict], None]
OnMessage = Callable[[str, dict, Reply], None]


class _Session:
    def __init__(self, node: Node, proc: NodeProcess, on_message: OnMessage) -> None:
        self.node, self.proc, self.on_message = node, proc, on_message
        self.out: list[str] = []
        self.err: list[str] = []
        self.started = time.monotonic()
        self.timed_out = False
        self.failure: str | None = None
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read_stdout, daemon=True),
                        threading.Thread(target=self._read_stderr, daemon=True)]

    def start(self, opening: bytes) -> None:
        for t in self.threads:
            t.start()
        threading.Thread(target=self._write, args=(opening,), daemon=True).start()  # nodes start together

    def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None  # spawned with stdin, stdout and stderr pipes
        with self._lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # the node is gone; its result says why

    def reply(self, message: dict) -> None:
        self._write((json.dumps(message) + "\n").encode())

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            message = _message(line)
            if message is None:
                self.out.append(line)
                continue
            try:
                self.on_message(self.node.name, message, self.reply)
            except Exception as exc:  # the control side's own failure: stop this node, say why
                self.failure = f"stopped by this machine: {type(exc).__name__}: {exc}"
                kill(self.proc)
        self.proc.stdout.close()
        with self._lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            self.err.append(raw.decode("utf-8", "replace"))
        self.proc.stderr.close()

    def result(self) -> HostResult:
        duration = time.monotonic() - self.started
        stdout, stderr, code = "".join(self.out), "".join(self.err), self.proc.returncode
        if self.timed_out:
            return HostResult(self.node.name, None, stdout, stderr, duration, "timed out")
        if self.failure:
            return HostResult(self.node.name, code, stdout, stderr + self.failure + "\n", duration)
        error = classify_ssh_failure(stderr) if code == 255 else None
        return HostResult(self.node.name, code, stdout, stderr, duration, error)


def _message(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def kill(proc: NodeProcess) -> None:
    stop_process(proc)


def run_sessions(link: Link, nodes: Iterable[Node], command: str, *, opening: Callable[[Node], bytes],
                 on_message: OnMessage, timeout: float | None = None) -> GroupResult:
    """Run ``command`` on every node, write ``opening(node)`` to its stdin and keep talking to it."""
    sessions: list[_Session] = []
    try:
        for node in nodes:
            data = opening(node)
            session = _Session(node, link.spawn(node, command, data), on_message)
            sessions.append(session)
            session.start(data)
        wait_all(sessions, timeout)
        for s in sessions:
            for t in s.threads:
                t.join(timeout=5)
    except BaseException:
        for s in sessions:
            kill(s.proc)
        raise
    return GroupResult([s.result() for s in sessions])
