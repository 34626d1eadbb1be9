"""`exec`: one command on selected nodes in parallel (the seeds' runclust)."""

from __future__ import annotations

from clustertool.core import nodeset
from clustertool.core.model import GroupResult
from clustertool.remote.group import LineCallback, run_on_nodes
from clustertool.remote.remoterequests import ExecRequest
from clustertool.remote.transport import Link


def execute(link: Link, request: ExecRequest, *, on_line: LineCallback | None = None) -> GroupResult:
    """The request's command on its nodes at once; ``on_line(node, stream, line)`` sees output as it comes."""
    cluster = link.ready()
    nodes = nodeset.select(cluster, request.nodes)
    return run_on_nodes(link, nodes, request.line, timeout=request.timeout, on_line=on_line)
