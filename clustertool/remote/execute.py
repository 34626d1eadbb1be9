"""`exec`: one command on selected nodes in parallel (the seeds' runclust)."""

from __future__ import annotations

import shlex

from clustertool.core import nodeset
from clustertool.core.model import GroupResult, HostResult
from clustertool.remote.group import LineCallback, run_on_nodes
from clustertool.remote.remoterequests import ExecRequest
from clustertool.remote.transport import Link

TIMEOUT_EXIT = 124  # what timeout(1) exits with when it stopped the command
KILL_AFTER_S = 2  # after the node's timeout TERMs the command: KILL for what is left


def bounded_line(line: str, seconds: float) -> str:
    """``line`` as the node runs it under ``--timeout``: in the user's shell, as ssh runs it, under the node's
    own timeout(1), so the command does not outlive the timeout (where the node has no timeout(1), as is)."""
    shell = f'"${{SHELL:-/bin/sh}}" -c {shlex.quote(line)}'
    return (f"if command -v timeout >/dev/null 2>&1; then exec timeout -k {KILL_AFTER_S} {seconds:g} {shell}; "
            f"else exec {shell}; fi")


def _timed_out(result: HostResult, seconds: float | None) -> HostResult:
    """A node whose own timeout stopped the command (it ran the whole time): timed out, like one stopped here."""
    if seconds is not None and result.exit_code == TIMEOUT_EXIT and result.duration >= seconds:
        result.exit_code, result.error = None, "timed out"
    return result


def execute(link: Link, request: ExecRequest, *, on_line: LineCallback | None = None) -> GroupResult:
    """The request's command on its nodes at once; ``on_line(node, stream, line)`` sees output as it comes.
    With a timeout, a node still running then counts as timed out, and its command is stopped there too."""
    cluster = link.ready()
    nodes = nodeset.select(cluster, request.nodes)
    line = request.line if request.timeout is None else bounded_line(request.line, request.timeout)
    result = run_on_nodes(link, nodes, line, timeout=request.timeout, on_line=on_line)
    return GroupResult([_timed_out(r, request.timeout) for r in result.results])
