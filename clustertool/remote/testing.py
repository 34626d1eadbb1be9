"""Stand-in transports: what runs "on a node" runs as a local shell instead, no ssh and no root.

* ``LocalShell``: the command runs with ``sh -c`` on this machine (for the fan-out itself).
* ``ScriptedTransport``: every node has its own home folder under a temporary directory, and
  every call is recorded (node, command, stdin).  A rule that matches the call (its node, its
  command line, or the program it gets on stdin) scripts the reply: stdout, stderr, exit
  code, or a hang; with no rule matching, the command really runs with ``sh -c`` in the
  node's home (HOME set to it), so node programs (manifests, small ops, status folders) work
  on real files.  That is the seam the orchestration tests need: the code under test builds
  the same command lines and programs it sends over ssh, and gets real processes back.

The real-sshd tests in tests/local run the same code against sshd in network namespaces.
Shipped with the package so users test their own scripts the same way:
``Cluster(record, transport=ScriptedTransport(tmp_path))`` (clustertool's own suite does).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from clustertool.core.model import Node
from clustertool.remote.transport import Transport


class LocalShell(Transport):
    """The command runs with ``sh -c`` here (ssh swapped out; the fan-out is under test)."""

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        return ["sh", "-c", command or "true"]


@dataclass
class Call:
    node: str
    command: str
    stdin: str | None  # None: the call got no stdin (or was a pipeline head, which the fake cannot see)


@dataclass
class Reply:
    stdout: str = ""
    stderr: str = ""
    code: int = 0
    hang: bool = False  # never answer (until killed): for timeouts
    effect: Callable[[Call], None] | None = None  # runs here when the call starts, e.g. to write a node's files

    @classmethod
    def unreachable(cls, address: str = "10.0.0.9") -> Reply:
        """What ssh says when a node's sshd is gone."""
        return cls(stderr=f"ssh: connect to host {address} port 22: Connection refused\n", code=255)

    def script(self) -> str:
        lines = ["cat > /dev/null"]  # take stdin like the real command would
        if self.stdout:
            lines.append(f"printf %s {shlex.quote(self.stdout)}")
        if self.stderr:
            lines.append(f"printf %s {shlex.quote(self.stderr)} >&2")
        if self.hang:
            lines.append("exec sleep 600")
        lines.append(f"exit {self.code}")
        return "\n".join(lines)


Matcher = Callable[[Call], bool]


@dataclass
class _Rule:
    match: Matcher
    reply: Reply | Callable[[Call], Reply]
    times: int | None  # how many calls it answers (None: all)


@dataclass
class ScriptedTransport(Transport):
    root: Path
    rules: list[_Rule] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def home(self, node: str | Node) -> Path:
        path = self.root / (node.name if isinstance(node, Node) else node)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def on(self, match: str | Matcher, reply: Reply | Callable[[Call], Reply], *, node: str | None = None,
           times: int | None = None) -> ScriptedTransport:
        """Script the reply to calls whose command or stdin contains ``match`` (or that ``match(call)``)."""
        test = match if callable(match) else (lambda c, s=match: s in c.command or s in (c.stdin or ""))
        self.rules.append(_Rule(lambda c: (node is None or c.node == node) and test(c), reply, times))
        return self

    def to(self, node: str) -> list[Call]:
        return [c for c in self.calls if c.node == node]

    def _argv(self, node: Node, command: str, stdin: bytes | None) -> list[str]:
        call = Call(node.name, command, None if stdin is None else stdin.decode("utf-8", "replace"))
        with self._lock:
            self.calls.append(call)
            rule = next((r for r in self.rules if (r.times is None or r.times > 0) and r.match(call)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
        if rule is None:
            home = self.home(node)
            return ["env", f"HOME={home}", "sh", "-c", f'cd "$HOME" && {command}']
        reply = rule.reply(call) if callable(rule.reply) else rule.reply
        if reply.effect is not None:
            reply.effect(call)
        return ["sh", "-c", reply.script()]

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        return self._argv(node, command or "true", None)

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._argv(node, command, stdin),
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
