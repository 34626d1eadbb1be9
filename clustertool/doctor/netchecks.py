"""Checks that exercise the network: SSH mesh, `mpirun hostname`; iperf3's client line and report
(the rounds of pairs that use them: netprobe.py)."""

from __future__ import annotations

import json
import shlex

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import ClusterRecord, Node
from clustertool.doctor.findings import Finding
from clustertool.jobs.mpirun import MpiOptions, build_argv, cluster_subnet
from clustertool.remote.group import run_on_node


def mesh_findings(cluster: ClusterRecord, sources: list[Node], outputs: dict[str, str],
                  unreachable: set[str], peers: dict[str, list[Node]] | None = None) -> list[Finding]:
    """Findings from each source's mesh output; ``peers``: whom each source tried (all others
    when not given), to tell "no node can reach X" from "these nodes cannot"."""
    by_addr = {n.address: n.name for n in cluster.nodes}

    def tried(target: str) -> int:
        if peers is None:
            return len([s for s in sources if s.name != target])
        return len([s for s in sources if any(p.name == target for p in peers.get(s.name, []))])

    failed_to: dict[str, list[tuple[str, str]]] = {}
    for src in sources:
        for line in outputs.get(src.name, "").splitlines():
            if line.startswith("fail "):
                parts = line.split(" ", 2)
                target = by_addr.get(parts[1], parts[1])
                failed_to.setdefault(target, []).append((src.name, parts[2] if len(parts) > 2 else ""))
    out = []
    for target, fails in sorted(failed_to.items()):
        srcs = ", ".join(s for s, _ in fails)
        reason = fails[0][1].strip() or "failed"
        hostkey = "host key" in reason.lower() or "identification" in reason.lower()
        if target in unreachable and len(fails) == tried(target):
            msg = f"no node can ssh to {target} ({reason})"
        else:
            msg = f"{srcs} cannot ssh to {target}: {reason}"
        out.append(Finding(
            "ssh-mesh", target, "error", msg,
            fix=("`doctor --fix` pushes the pinned keys and known_hosts to every node again" if hostkey else
                 f"check sshd on {target} (`clustertool reboot --nodes {target}` restarts it)"),
            fixable=hostkey, data={"from": [s for s, _ in fails]}))
    return out


def smoke_test(session: ClusterSession, timeout: float = 90.0) -> list[Finding]:
    """`mpirun hostname` over every slot: each rank must answer, every node must appear."""
    cluster = session.record
    nodes = cluster.workers  # servers run no ranks
    opts = MpiOptions(command=["hostname"], as_root=cluster.user == "root", tag_output=False, unbuffered=False,
                      subnet=cluster_subnet([n.address for n in nodes]))
    argv = build_argv([(n.address, n.slots) for n in nodes], opts)
    result = run_on_node(session, cluster.leader, shlex.join(argv), timeout=timeout)
    # one host name per rank; mpirun's own notices (lines with spaces) are not answers
    names = [x.strip() for x in result.stdout.splitlines() if x.strip() and " " not in x.strip()]
    expected = cluster.total_slots
    if result.ok and len(names) == expected and len(set(names)) == len(nodes):
        return []
    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
    why = result.reason or "exit 0"
    return [Finding("mpi-smoke", None, "error",
                    f"`mpirun hostname` over {expected} slot(s): {len(names)} answer(s) from "
                    f"{len(set(names))} host(s) of {len(nodes)} ({why}): {' | '.join(tail)[:300]}",
                    fix="read the mpirun message; `clustertool doctor` ssh-mesh findings come first",
                    data={"argv": argv})]


def iperf_client_line(src: Node, dst: Node, port: int, seconds: int = 1) -> str:
    return (f"iperf3 -c {shlex.quote(dst.address)} -B {shlex.quote(src.address)} -p {port} "
            f"-t {seconds} --bidir -J --connect-timeout 3000")


def parse_iperf(text: str) -> float:
    """The slower direction of a --bidir test, bits/s; raises ValueError on an error report."""
    data = json.loads(text)
    if data.get("error"):
        raise ValueError(data["error"])
    end = data["end"]
    values = [end[k]["bits_per_second"] for k in ("sum_received", "sum_received_bidir_reverse") if k in end]
    if not values:
        raise ValueError("no received totals in iperf3 output")
    return float(min(values))
