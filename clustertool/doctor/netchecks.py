"""Checks that exercise the network: SSH mesh, `mpirun hostname`, pairwise bandwidth."""

from __future__ import annotations

import json
import secrets
import shlex

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import ClusterRecord, Node
from clustertool.doctor.findings import Finding
from clustertool.jobs.mpirun import MpiOptions, build_argv, cluster_subnet
from clustertool.remote.group import run_on_node, run_on_nodes


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


def _pairs(nodes: list[Node]) -> list[tuple[Node, Node]]:
    n = len(nodes)
    if n <= 8:
        return [(nodes[i], nodes[j]) for i in range(n) for j in range(i + 1, n)]
    pairs = {}
    for i in range(n):  # a ring plus the opposite node: every node in 4 pairs
        for j in (i + 1, i + n // 2):
            a, b = sorted((i, j % n))
            if a != b:
                pairs[(a, b)] = (nodes[a], nodes[b])
    return list(pairs.values())


def rounds(pairs: list[tuple[Node, Node]]) -> list[list[tuple[Node, Node]]]:
    """Group pairs into rounds in which no node appears twice (greedy)."""
    out: list[list[tuple[Node, Node]]] = []
    for pair in pairs:
        for r in out:
            if all(pair[0] not in p and pair[1] not in p for p in r):
                r.append(pair)
                break
        else:
            out.append([pair])
    return out


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


def link_check(session: ClusterSession, nodes: list[Node], parallel: bool,
               only: set[str] | None = None) -> tuple[dict, dict]:
    """Pairwise bandwidth with iperf3 (servers on each node for the duration of the check).

    ``only``: measure just the pairs that involve one of these node names.
    """
    port = 41000 + secrets.randbelow(8000)
    pidfile = f"/tmp/ct-doctor-iperf-{port}.pid"
    start = lambda n: (f"iperf3 -s -D -B {shlex.quote(n.address)} -p {port} -I {pidfile} "  # noqa: E731
                       f">/dev/null 2>&1; sleep 0.2")
    stop = f"[ -f {pidfile} ] && kill $(cat {pidfile}) 2>/dev/null; rm -f {pidfile}; true"
    pairs: dict[tuple[str, str], float] = {}
    failed: dict[tuple[str, str], str] = {}
    run_on_nodes(session, nodes, start, timeout=20)
    try:
        todo = [p for p in _pairs(nodes) if only is None or p[0].name in only or p[1].name in only]
        plan = rounds(todo)
        batches = plan if parallel else [[p] for r in plan for p in r]
        for batch in batches:
            srcs = [a for a, _ in batch]
            peer = {a.name: b for a, b in batch}
            result = run_on_nodes(session, srcs, lambda n: iperf_client_line(n, peer[n.name], port), timeout=30)
            for r in result.results:
                key = (r.node, peer[r.node].name)
                try:
                    pairs[key] = parse_iperf(r.stdout)
                except (ValueError, KeyError) as exc:
                    failed[key] = r.reason if r.error else str(exc)[:200]  # unreachable, else iperf3's word
    finally:
        run_on_nodes(session, nodes, stop, timeout=20)
    return pairs, failed
