"""`replace --copy`: new machines for nodes, then what their new disks lack copied back from the leader.

The replacement itself is cluster/replace.py's (under the cluster's lock, all or nothing per node); the
copies go from the leader's disk to the same path on each new node, through the relay, verified
(transfer/copy.py).  The recovery loop (jobs/recovery.py) puts paths back the same way after it
replaced a node a job lost.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence

from clustertool.cluster import replace
from clustertool.cluster.clusterrequests import ReplaceRequest
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError, UsageError
from clustertool.remote.group import run_on_node
from clustertool.transfer.copy import copy
from clustertool.transfer.results import CopyResult
from clustertool.transfer.transferrequests import CopyRequest


@dataclass
class Refilled(replace.ReplaceResult):
    """What `replace` did, with what ``copy`` put back (``to_dict()`` is its --json)."""

    copied: list[CopyResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(super().to_dict(), copied=[c.to_dict() for c in self.copied])


def replace_and_refill(session: ClusterSession, request: ReplaceRequest) -> Refilled:
    """`replace`: the request's nodes replaced, then its ``copy`` paths copied from the leader onto the new ones."""
    if request.copy:
        check_copy(session, request.nodes, request.copy)
    done = replace.replace(session, request.nodes, keep_old=request.keep_old)
    out = Refilled(**vars(done))
    out.copied = copy_back(session, [r.node for r in done.replaced], request.copy)
    return out


def check_copy(session: ClusterSession, selection: str, paths: Sequence[str]) -> None:
    """Before a `replace --copy`: the leader keeps its disk (it gives the copy) and holds every path."""
    leader = session.record.leader
    if leader.name in {n.name for n in nodeset.select(session.record, selection)}:
        raise UsageError(f"--copy: the leader {leader.name} is being replaced, so no disk of the cluster keeps the "
                         "copy to give",
                         hint="replace it without --copy, then `clustertool copy --from local SRC DEST`")
    missing = run_on_node(session, leader, " && ".join(f"test -e {shlex.quote(p)}" for p in paths), timeout=20)
    if not missing.ok:
        raise UsageError(f"--copy: {', '.join(paths)}: not (all) on the leader {leader.name}",
                         hint="give paths as they are on the leader (relative: to its home)")


def copy_back(session: ClusterSession, nodes: list[str], paths: Sequence[str]) -> list[CopyResult]:
    """Each of ``paths`` from the leader to the same path on ``nodes`` (new disks), through the relay."""
    leader = session.record.leader.name
    if paths and leader in nodes:
        raise UsageError(f"--copy: the leader {leader} is new too, so it has no copy to give",
                         hint="copy from your machine: `clustertool copy --from local SRC DEST`")
    done = []
    for path in paths:
        session.report(f"copying {path} from {leader} to {nodeset.fold(nodes)}")
        result = copy(session, CopyRequest(path, path, source="leader", nodes=",".join(nodes)))
        if result.exit_code != 0:
            raise ToolError(f"--copy {path}: the copy to {nodeset.fold(nodes)} did not complete "
                            f"(exit {result.exit_code})", hint=f"`clustertool copy {path} {path} -n "
                                                               f"{nodeset.fold(nodes)}` again")
        done.append(result)
    return done
