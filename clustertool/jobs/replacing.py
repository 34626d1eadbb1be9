"""One replacement a job's leader waits for, as a function of the leader's wait (not of a local job record):
what `clustertool recover` (jobs/recovery.py) and the cluster's controller (controller/loop.py) both call.

The leader's restart loop (nodeprogs/restarts.py) wrote ``waiting`` ({nodes, attempt, until}) and waits for a
``replaced`` file in the job's folder.  :func:`replace_waiting` claims that wait first with ``mkdir
replacing.<attempt>`` on the leader (atomic: two replacers, `recover` here and a controller, never replace the
same node twice), runs `replace` on the nodes, puts back what their new disks lack (the job agent of a node
launcher, found as ``agent.json`` in the job's folder on the leader; the ``copy`` paths), then writes
``replaced`` with ``by`` (who replaced them: `jobs` says it).  A failed replacement gives the claim back, so
the next round (of either replacer) tries again.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Sequence

from clustertool.cluster.replace import replace
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError
from clustertool.core.model import Node, Reporter
from clustertool.jobs import scripts
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.transfer.refill import copy_back

CLAIM_TIMEOUT_S = 20.0


@dataclass
class Recovered:
    job: str
    nodes: list[str]
    cause: str  # "node-3 lost", "node-2 spot interruption"
    attempt: int  # the attempt that ended (the next one runs on the new nodes)
    detected: float  # when the leader started waiting
    replaced: float  # when the leader was told to go on
    seconds: float  # the replacement itself


class NotReplaced(ToolError):
    """The claim was taken but the replacement failed (given back: try again later)."""


def leader_port(node: Node) -> list:
    """[address, ssh port] as the leader reaches the node."""
    return [node.address, node.ssh_port if node.ssh_host in (None, node.address) else 22]


def claim_argv(job_id: str, attempt: int) -> str:
    return f"mkdir {scripts.job_dir_sh(job_id)}/replacing.{int(attempt)}"


def replaced_line(job_id: str, doc: dict) -> str:
    """The shell line that hands the leader its ``replaced`` document (written whole, then moved)."""
    d = scripts.job_dir_sh(job_id)
    return f"printf %s {shlex.quote(json.dumps(doc))} > {d}/replaced.tmp && mv {d}/replaced.tmp {d}/replaced"


def replace_waiting(session: ClusterSession, job_id: str, attempt: int, nodes: Sequence[str], *,
                    copy: Sequence[str] = (), by: str, report: Reporter, cause: str | None = None,
                    since: float = 0.0) -> Recovered | None:
    """Replace ``nodes`` for the wait ``attempt`` of ``job_id``; None when another replacer holds the claim.
    Raises :class:`NotReplaced` (the claim given back) when the replacement failed."""
    nodes = [str(n) for n in nodes]
    leader = session.record.leader
    if not nodes or not run_on_node(session, leader, claim_argv(job_id, attempt), timeout=CLAIM_TIMEOUT_S).ok:
        return None  # another replacer has it (or had it: the leader goes on once it wrote `replaced`)
    cause = cause or f"{', '.join(nodes)} lost"
    report(f"job {job_id}: {cause}; replacing {nodeset.fold(nodes)} (the job waits on {leader.name}; {by})")
    t0 = time.monotonic()
    try:
        replace(session, ",".join(nodes))
    except BaseException as exc:
        run_on_node(session, session.record.leader, f"rmdir {scripts.job_dir_sh(job_id)}/replacing.{int(attempt)}",
                    timeout=CLAIM_TIMEOUT_S)
        if not isinstance(exc, ToolError):
            raise
        raise NotReplaced(f"job {job_id}: replacing {nodeset.fold(nodes)} failed: {exc.message}",
                          hint=exc.hint) from exc
    try:
        after_replace(session, job_id, nodes, copy)
    except ToolError as exc:  # the node is new: the job goes on; what failed here can be done by hand
        report(f"job {job_id}: {exc.message}")
    record = session.record
    doc = {"attempt": int(attempt), "at": time.time(), "by": by,
           "nodes": {n: leader_port(record.node(n)) for n in nodes}}
    told = run_on_node(session, record.leader, replaced_line(job_id, doc), timeout=CLAIM_TIMEOUT_S)
    if not told.ok:
        raise ToolError(f"replaced {nodeset.fold(nodes)} but could not tell the leader: {told.reason}")
    seconds = round(time.monotonic() - t0, 2)
    report(f"job {job_id}: {nodeset.fold(nodes)} replaced in {seconds:.1f}s; the leader starts attempt "
           f"{int(attempt) + 1}")
    return Recovered(job_id, nodes, cause, int(attempt), since, time.time(), seconds)


def after_replace(session: ClusterSession, job_id: str, nodes: Sequence[str], copy: Sequence[str] = ()) -> None:
    """What the new disks lack: the job agent (a node launcher's job has ``agent.json``) and the ``copy`` paths."""
    record = session.record
    new = [record.node(n) for n in nodes]
    agent = run_on_node(session, record.leader, f"cat {scripts.job_dir_sh(job_id)}/agent.json", timeout=20)
    if agent.ok and agent.stdout.strip():
        script = scripts.agent_install_script(job_id, agent.stdout)
        run_on_nodes(session, new, "sh -s", timeout=30, stdin_data=script.encode())
    copy_back(session, [n.name for n in new], list(copy))
