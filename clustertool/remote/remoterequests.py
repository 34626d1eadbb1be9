"""What a user asks of `exec`, as one typed value: built alike by the CLI and the API, checked once when
made (a bad value is one UsageError naming the flag, with a hint)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from clustertool.core.errors import UsageError


@dataclass(frozen=True)
class ExecRequest:
    """One `clustertool exec -- COMMAND`: one word is a shell line (as ssh takes it), several are quoted
    each; on the selected nodes (default: all) at once, ``timeout`` seconds each (None: no limit)."""

    command: tuple[str, ...]
    nodes: str | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        words = self.command[1:] if self.command[:1] == ("--",) else self.command
        if not words:
            raise UsageError("no command given", hint="clustertool exec -- COMMAND [ARGS...]")
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError(f"--timeout {self.timeout:g}: give seconds above 0", hint="e.g. --timeout 30")
        object.__setattr__(self, "command", tuple(words))

    @property
    def line(self) -> str:
        """What each node's shell runs."""
        return self.command[0] if len(self.command) == 1 else shlex.join(self.command)

    @classmethod
    def of(cls, command: str | Sequence[str], *, nodes: str | None = None,
           timeout: float | None = None) -> "ExecRequest":
        """``command`` one string (a shell line) or a list of words."""
        words = (command,) if isinstance(command, str) else tuple(str(w) for w in command)
        return cls(words, nodes=nodes, timeout=timeout)
