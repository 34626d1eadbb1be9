"""`doctor --cordon`: cordon every node doctor found at error severity; and doctor's note on cordoned nodes.

A finding names a node when its ``node`` is one of the cluster's and it is not about a link
between two nodes: a link finding carries ``data["link"]`` (or "pair"/"peer"), says ``a <-> b``,
or is an ssh-mesh finding where only some nodes cannot reach the target (the target is fine for
the others: which side is bad is not known).  A link is never a reason to cordon a node; nor is a
warning.  The leader cannot be cordoned: its findings are listed as skipped.  Cordoning touches
only this machine's record and hostfile and the leader (cluster/cordon.py), never the bad node.
"""

from __future__ import annotations

from clustertool.cluster.cordon import CordonResult, cordon_nodes, describe
from clustertool.cluster.session import ClusterSession
from clustertool.core.model import ClusterRecord
from clustertool.doctor.findings import AutoCordon, CheckResult, Diagnosis, Finding

LINK_KEYS = ("link", "pair", "peer")


def is_link(f: Finding) -> bool:
    """A finding about the link between two nodes rather than about one node."""
    if any(key in f.data for key in LINK_KEYS) or "<->" in f.message:
        return True
    return f.check == "ssh-mesh" and not f.message.startswith("no node can ssh to")


def reasons(cluster: ClusterRecord, diagnosis: Diagnosis) -> tuple[dict[str, str], list[dict[str, str]]]:
    """({node: the reason to cordon it}, [{node, why} doctor --cordon leaves alone: the leader])."""
    names = {n.name for n in cluster.nodes}
    found: dict[str, list[Finding]] = {}
    for f in diagnosis.findings:
        if f.severity == "error" and f.node in names and not is_link(f):
            found.setdefault(f.node, []).append(f)
    out, skipped = {}, []
    for node, fs in found.items():
        why = f"doctor {fs[0].check}: {fs[0].message}" + (f" (and {len(fs) - 1} more)" if len(fs) > 1 else "")
        if node == cluster.leader.name:
            skipped.append({"node": node, "why": f"the leader cannot be cordoned ({why})"})
        else:
            out[node] = why
    return out, skipped


def cordon_errors(session: ClusterSession, diagnosis: Diagnosis) -> AutoCordon:
    wanted, skipped = reasons(session.record, diagnosis)
    out = AutoCordon(skipped=skipped)
    if not wanted:
        return out
    result: CordonResult = cordon_nodes(session, wanted, by="doctor")
    out.cordoned = {name: wanted[name] for name in result.changed}
    out.already = list(result.unchanged)
    out.hostfile, out.leader_hostfile, out.slurm = result.hostfile, result.leader_hostfile, result.slurm
    return out


def notes(cluster: ClusterRecord) -> list[CheckResult]:
    """An info finding per cordoned node (doctor checks it all the same); none when no node is."""
    found = [Finding("cordon", n.name, "info", f"{describe(n.cordon)}; out of the hostfiles and jobs' default nodes",
                     fix=f"`clustertool uncordon {n.name}` once it is repaired") for n in cluster.cordoned]
    return [CheckResult("cordon", found)] if found else []
