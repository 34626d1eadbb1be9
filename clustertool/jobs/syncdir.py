"""`run --sync [DIR]`: a local folder onto the job's nodes, at the same absolute path, before the job.

The copy machinery does the work (transfer/copy.py: incremental by size and mtime, then by hash;
a pipelined relay; verified by hash on every node), fed only the files the folder's
``.gitignore`` / ``.clustertoolignore`` rules keep (transfer/ignore.py).  Files on the nodes that
the folder no longer has, or that it ignores, are left alone: the job's own outputs in its working
directory survive the next sync.
"""

from __future__ import annotations

import os

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import Node
from clustertool.transfer import ignore
from clustertool.transfer.copy import copy
from clustertool.transfer.results import CopyResult, ProgressCb
from clustertool.transfer.transferrequests import CopyRequest


def resolve(directory: str | None, dest: str | None = None) -> tuple[str, str]:
    """(the local folder, its path on the nodes): DIR (default: here), the same absolute path there."""
    local = os.path.abspath(os.path.expanduser(directory or "."))
    if not os.path.isdir(local):
        raise UsageError(f"--sync {directory!r}: no such folder here",
                         hint="the command goes after --: clustertool run --sync [DIR] -- python train.py")
    if local == "/":
        raise UsageError("--sync /: refusing to send the whole file system", hint="name the project's folder")
    target = dest or local
    if not os.path.isabs(target):
        raise UsageError(f"--sync-to {dest!r}: give an absolute path on the nodes", hint="e.g. --sync-to /scratch/proj")
    return local, os.path.normpath(target)


def _unwritable(dest: str, nodes: str, why: str) -> UsageError:
    return UsageError(f"--sync: cannot write {dest!r} (--sync-to) on {nodes}: {why}",
                      hint="no job was started; --sync-to PATH picks a folder the nodes can write, e.g. /scratch/proj")


def sync(session: ClusterSession, directory: str, dest: str, nodes: list[Node], *,
         on_progress: ProgressCb | None = None) -> CopyResult:
    """Send ``directory`` (less what its ignore rules leave out) to ``dest`` on ``nodes``.

    Raises when a node did not end up with the folder exactly (it then names the node and why).
    """
    matcher = ignore.Matcher(directory)
    request = CopyRequest(directory, dest, source="local", nodes=",".join(n.name for n in nodes))
    result = copy(session, request, keep=matcher.keep, on_progress=on_progress, unwritable_says=_unwritable)
    bad = [n for n in result.nodes if n.status != "ok"]
    if bad:
        by_reason: dict[str, list[str]] = {}
        for n in bad:
            by_reason.setdefault(n.error or n.status, []).append(n.node)
        detail = "; ".join(f"{nodeset.fold(nodes)}: {why}" for why, nodes in by_reason.items())
        raise ToolError(f"--sync: {directory} did not reach {nodeset.fold(n.node for n in bad)} intact: {detail}",
                        hint="no job was started; --sync-to PATH picks another folder on the nodes",
                        exit_code=max(n.exit_code for n in bad) or 1)
    return result
