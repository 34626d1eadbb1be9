"""Cordons are drains: on a Slurm cluster, `cordon` (and `doctor --cordon`) drains the node with the reason,
`uncordon` resumes it, so Slurm itself keeps new jobs off it (running ones finish).

On a cluster clustertool made, clustertool is Slurm's administrator (root on the leader).  On an adopted
one the user may not be a Slurm operator: the drain is tried, and where Slurm answers "permission denied"
the node is kept out of clustertool's jobs by ``--exclude`` instead (the record's cordon does that), and
the result says which.  The record learns whether the user is an operator (``operator``).
"""

from __future__ import annotations

from clustertool.cluster import slurmup
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset, state
from clustertool.core.model import ClusterRecord
from clustertool.remote.group import run_on_node
from clustertool.slurm import slurmcmd, slurminfo

DENIED = ("Access/permission denied", "Permission denied", "access denied")


def _compute(record: ClusterRecord, names: list[str]) -> tuple[slurminfo.SlurmInfo | None, list[str]]:
    found = slurminfo.of(record)
    if found is None or not found.ready:
        return None, []
    return found, [n for n in names if n in found.nodes]


def apply(session: ClusterSession, record: ClusterRecord, verb: str, names: list[str],
          reasons: dict[str, str]) -> str | None:
    """Drain (``cordon``) or resume (``uncordon``) the Slurm nodes among ``names``; one line saying what
    Slurm did (None: no Slurm node among them)."""
    found, nodes = _compute(record, names)
    if found is None or not nodes:
        return None
    if verb == "uncordon" and found.operator is False:
        return f"{nodeset.fold(found.slurm_names(nodes))}: back in clustertool's jobs (Slurm's state unchanged)"
    lines = []
    by_reason: dict[str, list[str]] = {}
    for name in nodes:
        by_reason.setdefault(reasons.get(name) or "cordoned by clustertool", []).append(name)
    for reason, group in (by_reason.items() if verb == "cordon" else [("", nodes)]):
        argv = (slurmcmd.drain_argv(found.slurm_names(group), f"clustertool: {reason}") if verb == "cordon"
                else slurmcmd.resume_argv(found.slurm_names(group)))
        result = run_on_node(session, record.leader, slurmup.admin_command(record, found, argv), timeout=30)
        said = (result.stdout + result.stderr).strip()
        hostlist = nodeset.fold(found.slurm_names(group))
        if result.ok:
            lines.append(f"{hostlist} {'drained' if verb == 'cordon' else 'resumed'} in Slurm")
            _operator(record, found, True)
        elif not found.made and any(word in said for word in DENIED):
            _operator(record, found, False)
            lines.append(f"{hostlist}: you are not a Slurm operator here, so it is not drained; clustertool's jobs "
                         "leave it out (--exclude)")
        else:
            lines.append(f"{hostlist}: scontrol update failed ({said.splitlines()[-1] if said else result.reason})")
    return "; ".join(lines)


def _operator(record: ClusterRecord, found: slurminfo.SlurmInfo, value: bool) -> None:
    if found.made or found.operator is value:
        return
    record.scheduler = {**(record.scheduler or {}), "operator": value}
    state.save(record)
