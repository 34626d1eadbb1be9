"""`cordon` / `uncordon`: keep a bad node out of the hostfiles and of every job's default nodes.

A cordon is a mark in the cluster record (``Node.cordon``: reason, since, by whom), written under
the cluster's lock; then the hostfiles are written again: this machine's (at the path `up`
recorded) and the leader's ``~/hostfile`` (when the cluster is ready; a stopped cluster's leader
gets it from `start`).  Nothing here reaches the cordoned node, so a node that is down can be
cordoned.  On a Slurm cluster the node is drained with the reason too, and `uncordon` resumes it
(cluster/slurmdrain.py).  `exec`, `copy`, `ssh` and `doctor` still reach it (to repair it); `run` with every
launcher, `bench` and `plugin check` leave it out, and `run --nodes` naming it is refused.  The
leader cannot be cordoned: every job's mpirun (or launcher) and rank 0 run there.  A cordoned
reduction server gets no reducer in `run --plugin` jobs (the others serve the job).
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clustertool.cluster import slurmdrain
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.wiring import write_hostfile
from clustertool.core import nodeset, state
from clustertool.core.errors import UsageError
from clustertool.core.hostfile import render_cluster
from clustertool.core.model import ClusterRecord, ClusterState, Node, jsonable
from clustertool.remote.group import run_on_node

REASON_MAX = 200  # characters of a cordon's reason kept


@dataclass
class CordonResult:
    """What `cordon` / `uncordon` did (``to_dict()`` is their --json)."""

    cluster: str
    verb: str  # cordon | uncordon
    changed: list[str] = field(default_factory=list)  # nodes whose mark this command set (or lifted)
    unchanged: list[str] = field(default_factory=list)  # already cordoned (cordon) / not cordoned (uncordon)
    cordons: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # each named node's cordon now
    cordoned: list[str] = field(default_factory=list)  # every cordoned node of the cluster now
    hostfile: str | None = None  # this machine's hostfile, written again (None: nothing changed)
    leader_hostfile: str = "unchanged"  # "written", "unchanged", or why it was not written
    slurm: str | None = None  # a Slurm cluster: what Slurm did (drained, resumed, or why not)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def clean_reason(text: str | None) -> str:
    """A reason as one line of at most REASON_MAX characters ("" when none was given)."""
    words = " ".join((text or "").split())
    return words if len(words) <= REASON_MAX else words[: REASON_MAX - 3] + "..."


def mark(reason: str | None, by: str = "user", now: float | None = None) -> dict[str, Any]:
    return {"reason": clean_reason(reason), "since": time.time() if now is None else now, "by": by}


def describe(cordon: dict[str, Any] | None, now: float | None = None) -> str:
    """``cordoned 5m ago by doctor: reason`` (how status, doctor and the commands word a node's cordon)."""
    c = cordon or {}
    age = max(0.0, (time.time() if now is None else now) - float(c.get("since") or 0))
    when = f"{age:.0f}s" if age < 120 else f"{age / 60:.0f}m" if age < 7200 else f"{age / 3600:.1f}h"
    by = f" by {c['by']}" if c.get("by") and c.get("by") != "user" else ""
    return f"cordoned {when} ago{by}" + (f": {c['reason']}" if c.get("reason") else "")


def leader_refused(node: Node) -> UsageError:
    return UsageError(
        f"{node.name} is the leader and cannot be cordoned: every job's mpirun (or launcher) and rank 0 run there",
        hint=f"repair it in place (`clustertool exec -n {node.name} -- …`, `clustertool reboot --nodes "
             f"{node.name} --yes`); a leader that stays bad needs a new cluster (`down`, then `up`)")


def cordon(session: ClusterSession, selection: str, *, reason: str | None = None) -> CordonResult:
    """Cordon the selected nodes (all or none: a selection with the leader changes nothing)."""
    def pick(record: ClusterRecord) -> dict[str, dict[str, Any] | None]:
        nodes = nodeset.select(record, selection)
        return _checked({n.name: mark(reason) for n in nodes}, record)
    return _apply(session, "cordon", pick)


def cordon_nodes(session: ClusterSession, reasons: dict[str, str], *, by: str = "user") -> CordonResult:
    """Cordon each named node with its own reason (`doctor --cordon`: the finding)."""
    def pick(record: ClusterRecord) -> dict[str, dict[str, Any] | None]:
        for name in reasons:
            record.node(name)  # an unknown name is a UsageError
        return _checked({name: mark(why, by) for name, why in reasons.items()}, record)
    return _apply(session, "cordon", pick)


def uncordon(session: ClusterSession, selection: str) -> CordonResult:
    """Put the selected nodes back into the hostfiles and jobs' default nodes."""
    def pick(record: ClusterRecord) -> dict[str, dict[str, Any] | None]:
        return {n.name: None for n in nodeset.select(record, selection)}
    return _apply(session, "uncordon", pick)


def _checked(wanted: dict[str, dict[str, Any] | None], record: ClusterRecord) -> dict[str, dict[str, Any] | None]:
    leader = record.leader
    if leader.name in wanted:
        raise leader_refused(leader)
    return wanted


def _apply(session: ClusterSession, verb: str,
           pick: Callable[[ClusterRecord], dict[str, dict[str, Any] | None]]) -> CordonResult:
    with session.locked(purpose=verb) as record:
        wanted = pick(record)
        out = CordonResult(record.name, verb)
        for name, new in wanted.items():
            node = record.node(name)
            if (new is None) == (node.cordon is None):  # already as asked: an earlier cordon keeps its reason
                out.unchanged.append(name)
                continue
            node.cordon = new
            out.changed.append(name)
        if out.changed:
            state.save(record)
            out.hostfile = str(write_local_hostfile(record))
            out.leader_hostfile = _write_leader(session, record)
        # cordons are drains (cluster/slurmdrain.py); uncordon resumes a node Slurm drained by itself too
        touched = out.changed if verb == "cordon" else list(wanted)
        if touched and record.status == ClusterState.READY:
            reasons = {n: str((record.node(n).cordon or {}).get("reason") or "") for n in touched}
            out.slurm = slurmdrain.apply(session, record, verb, touched, reasons)
        out.cordons = {name: record.node(name).cordon for name in wanted}
        out.cordoned = [n.name for n in record.cordoned]
        return out


def write_local_hostfile(record: ClusterRecord) -> Path:
    """This machine's hostfile, where `up` wrote it (or, never written, where `up` would)."""
    if not record.hostfile_path:
        path = write_hostfile(record)
        state.save(record)  # its path, for the next time
        return path
    path = Path(record.hostfile_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(render_cluster(record, "openmpi"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def leader_hostfile_script(text: str) -> str:
    """Shell (for ``sh -s``) that replaces the leader's ~/hostfile with ``text`` in one rename."""
    data = base64.b64encode(text.encode()).decode()
    return ('umask 022; t="$HOME/.hostfile.ct.$$"; '
            f'printf %s {data} | base64 -d > "$t" && mv -f "$t" "$HOME/hostfile"\n')


def _write_leader(session: ClusterSession, record: ClusterRecord) -> str:
    if record.status != ClusterState.READY:
        return f"not written: the cluster is {record.status} (`start` writes it)"
    result = run_on_node(session, record.leader, "sh -s", timeout=30,
                         stdin_data=leader_hostfile_script(render_cluster(record, "openmpi")).encode())
    if not result.ok:
        why = f"not written: {record.leader.name}: {result.reason}"
        session.report(f"the leader's ~/hostfile was {why}")
        return why
    return "written"
