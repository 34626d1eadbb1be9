"""doctor's ``slurm`` check, on a cluster with Slurm (skipped elsewhere): is the controller up, is every node
where the record says it should be, does munge work on every node, does Slurm count the GPUs each node has.

* controller: ``scontrol ping`` on the leader says UP;
* node states: ``sinfo`` against the record: a node down, not responding (``idle*``) or drained that the
  record does not cordon is an error; a node the record cordons that Slurm still schedules is a warning;
* munge: a credential made and decoded through each node's own munged;
* GRES: ``scontrol show node``'s ``gpu:N`` against the node's GPUs (``nvidia-smi -L``; where there is no
  driver, the /dev/nvidia<k> character devices: local stand-ins).

Each finding says its fix.  Nothing here changes Slurm (an adopted cluster's is never ours to change).
"""

from __future__ import annotations

import shlex

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import Node
from clustertool.doctor.findings import CheckResult, Finding
from clustertool.remote.group import run_on_nodes
from clustertool.slurm import bringup, munge, slurmcmd, slurminfo, slurmtext
from clustertool.slurm.slurminfo import SlurmInfo

NAME = "slurm"
BAD_STATES = ("down", "drained", "draining", "drain", "fail", "failing", "not_responding", "unknown", "inval")


def _node_script(found: SlurmInfo) -> str:
    """Per node: ``munge OK|said ...`` and ``gpus N nvidia-smi|devices``."""
    check = f"{shlex.join(munge.check_argv(found.layout))} | {shlex.join(munge.decode_argv(found.layout))}"
    return "\n".join([
        f"if out=$({check} 2>&1) && echo \"$out\" | grep -q 'STATUS: *Success'; then echo 'munge OK'; "
        "else echo \"munge $(echo \"$out\" | tail -n 1)\"; fi",
        "if command -v nvidia-smi >/dev/null 2>&1; then echo \"gpus $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') "
        "nvidia-smi\"; else n=0; for d in /dev/nvidia[0-9]*; do case \"${d#/dev/nvidia}\" in *[!0-9]*) continue;; "
        "esac; [ -c \"$d\" ] && n=$((n + 1)); done; echo \"gpus $n devices\"; fi",
    ])


def _fix(found: SlurmInfo, made: str, adopted: str) -> str:
    return made if found.made else adopted


def controller(session: ClusterSession, found: SlurmInfo) -> list[Finding]:
    leader = session.record.leader
    result = bringup.run_slurm(session, leader, found.layout, slurmcmd.ping_argv(), timeout=30)
    if result.ok and " is UP" in result.stdout:
        return []
    said = (result.stdout + result.stderr).strip().splitlines()
    return [Finding(NAME, leader.name, "error", f"slurmctld does not answer: {said[-1] if said else result.reason}",
                    fix=_fix(found, f"`clustertool reboot --nodes {leader.name}` starts it again; its log: "
                                    f"{found.layout.log_file('slurmctld')} on {leader.name}",
                         "the site's controller is down or unreachable from the login node: ask its admins"))]


def node_states(session: ClusterSession, found: SlurmInfo) -> tuple[list[Finding], dict[str, slurmtext.SinfoNode]]:
    record = session.record
    result = bringup.run_slurm(session, record.leader, found.layout, slurmcmd.sinfo_nodes_argv(), timeout=30)
    if not result.ok:
        return [Finding(NAME, record.leader.name, "error", f"sinfo failed: {result.reason}",
                        fix="see the controller finding")], {}
    seen = {n.name: n for n in slurmtext.sinfo_nodes(result.stdout)}
    out = []
    for node in found.compute(record):
        name = found.slurm_name(node.name)
        state = seen.get(name)
        if state is None:
            out.append(Finding(NAME, node.name, "error", f"Slurm does not list {name}",
                               fix=_fix(found, f"`clustertool replace {node.name}` writes its config again",
                                        "the site's slurm.conf no longer has it: `clustertool down` and adopt again")))
            continue
        out += _state_finding(found, node, state)
    return out, seen


def _state_finding(found: SlurmInfo, node: Node, seen: slurmtext.SinfoNode) -> list[Finding]:
    where = f"{seen.state}{seen.flags}" + (f" ({seen.reason})" if seen.reason not in ("", "none") else "")
    data = {"slurm_state": seen.state, "flags": seen.flags, "reason": seen.reason}
    if "*" in seen.flags:
        return [Finding(NAME, node.name, "error", f"slurmd does not answer: Slurm says {where}", data=data,
                        fix=_fix(found, f"`clustertool reboot --nodes {node.name}` starts it again; its log: "
                                        f"{found.layout.log_file('slurmd')} on {node.name}",
                                 f"slurmd on {node.name} is down: ask the site's admins"))]
    bad = seen.state.split("+")[0] in BAD_STATES or "drain" in seen.state
    if bad and not node.cordoned:
        return [Finding(NAME, node.name, "error", f"not schedulable in Slurm though not cordoned here: {where}",
                        data=data, fix=f"repair it, then `clustertool uncordon {node.name}` (resumes it in Slurm); "
                                       f"or `clustertool cordon {node.name}` to say so here too")]
    if not bad and node.cordoned and (found.made or found.operator):
        return [Finding(NAME, node.name, "warning", f"cordoned here but {where} in Slurm: other users' jobs go there",
                        data=data, fix=f"`clustertool uncordon {node.name}` then `clustertool cordon {node.name}` "
                                       "drains it again")]
    return []


def per_node(session: ClusterSession, found: SlurmInfo) -> list[Finding]:
    """munge on every Slurm node (the controller too), and each compute node's GRES against its GPUs."""
    record = session.record
    nodes = [n for n in record.ordered_nodes() if n.name in found.nodes or n.name == found.controller]
    result = run_on_nodes(session, nodes, "sh -s", timeout=30, stdin_data=_node_script(found).encode())
    shown = bringup.run_slurm(session, record.leader, found.layout, slurmcmd.show_argv("node"), timeout=30)
    gres = {i.name: i.gres for i in map(slurmtext.node_info, slurmtext.records(shown.stdout))} if shown.ok else {}
    out = []
    for r in result.results:
        if not r.ok:
            out.append(Finding(NAME, r.node, "warning", f"could not check munge and GPUs: {r.reason}",
                               fix="see the reach check"))
            continue
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
        if lines.get("munge") != "OK":
            out.append(Finding(NAME, r.node, "error", f"munge does not work: {lines.get('munge', '?')}",
                               fix=_fix(found, f"`clustertool reboot --nodes {r.node}` starts munged again "
                                               f"(socket {found.layout.munge_socket}, log "
                                               f"{found.layout.log_file('munged')})",
                                        f"munged on {r.node} does not answer: ask the site's admins")))
        out += _gres(found, r.node, lines.get("gpus", "0 devices"), gres)
    return out


def _gres(found: SlurmInfo, node: str, gpus_line: str, gres: dict[str, str]) -> list[Finding]:
    if node not in found.nodes:
        return []
    has, _, how = gpus_line.partition(" ")
    counted = slurmtext_gpus(gres.get(found.slurm_name(node), ""))
    if not has.isdigit() or int(has) == counted:
        return []
    source = "nvidia-smi" if how == "nvidia-smi" else "its /dev/nvidia<k> devices"
    return [Finding(NAME, node, "error", f"Slurm counts {counted} GPU(s) (gpu:{counted}), the node has {has} "
                    f"({source})", data={"gres": counted, "gpus": int(has)},
                    fix=_fix(found, f"a GPU is gone: `clustertool doctor --check gpu`, then `clustertool replace "
                                    f"{node}` (its slurm.conf line is written from what it has)",
                             f"a GPU is gone or gres.conf is wrong on {node}: ask the site's admins"))]


def slurmtext_gpus(gres: str) -> int:
    """``gpu:2``, ``gpu:a100:8(S:0-1)`` -> 2, 8 (0: none)."""
    total = 0
    for part in gres.split(","):
        words = part.split("(")[0].split(":")
        if words[0] == "gpu" and words[-1].isdigit():
            total += int(words[-1])
    return total


def check(session: ClusterSession, reachable: list[Node]) -> CheckResult:
    found = slurminfo.of(session.record)
    if found is None or not found.ready:
        return CheckResult(NAME, skipped="no Slurm")
    findings = controller(session, found)
    if findings:
        return CheckResult(NAME, findings)
    states, seen = node_states(session, found)
    return CheckResult(NAME, states + per_node(session, found),
                       data={"release": found.release, "nodes": {k: f"{v.state}{v.flags}" for k, v in seen.items()}})
