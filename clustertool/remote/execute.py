"""`exec`: one command on selected nodes in parallel (the seeds' runclust)."""

from __future__ import annotations

import shlex
from typing import Sequence

from clustertool.core import nodeset
from clustertool.core.errors import UsageError
from clustertool.core.model import GroupResult
from clustertool.remote.group import LineCallback, run_on_nodes
from clustertool.remote.transport import Link


def command_line(args: Sequence[str]) -> str:
    """A single argument is a shell command line (like ssh); several are quoted each."""
    args = list(args)[1:] if list(args)[:1] == ["--"] else list(args)
    if not args:
        raise UsageError("no command given", hint="clustertool exec -- COMMAND [ARGS...]")
    return args[0] if len(args) == 1 else shlex.join(args)


def execute(link: Link, selection: str | None, args: Sequence[str], *,
            timeout: float | None = None, on_line: LineCallback | None = None) -> GroupResult:
    cluster = link.ready()
    nodes = nodeset.select(cluster, selection)
    if timeout is not None and timeout <= 0:
        raise UsageError("--timeout must be positive")
    return run_on_nodes(link, nodes, command_line(args), timeout=timeout, on_line=on_line)
