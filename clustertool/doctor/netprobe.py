"""The network check (`doctor --check network`, `doctor --bisect`): rounds of pairs on the nodes.

Each node runs iperf3's server and a small TCP echo server (nodeprogs/pairprobe.py) for the
check's duration.  A round measures all its pairs at once: first the round trip (median of 20
trips over one TCP connection, Nagle off), then bandwidth (``iperf3 --bidir``, the slower
direction), each pair's first node the client.  Bandwidth is iperf3's TCP figure everywhere:
where the NCCL plugin is deployed its own point-to-point path could be measured instead, but the
plugin has no pair mode yet, so iperf3 is what runs.

When the search names nodes and the plugin's ``collnet_bench`` is deployed, an allreduce on each
half of the workers (Open MPI's MPI_Allreduce, ``collnet_bench -a mpi``, both halves at once, the
named nodes in one) shows what a job feels: the half with them should run slower.  Without the
deployed program the search's confirming round of pairs stands alone (the check says so).
"""

from __future__ import annotations

import json
import secrets
import shlex

from clustertool.bench.allreduce import bench_argv, parse_rows
from clustertool.cluster.session import ClusterSession
from clustertool.core.model import Node
from clustertool.doctor import bisect_report
from clustertool.doctor.bisect import DEFAULT_THRESHOLD, Measurement, Pair, SearchResult, search
from clustertool.doctor.findings import CheckResult, Finding
from clustertool.doctor.netchecks import iperf_client_line, parse_iperf
from clustertool.jobs.mpirun import MpiOptions, build_argv, cluster_subnet
from clustertool.nodeprogs import program_text, python_command
from clustertool.plugin.build import BENCH, load_record
from clustertool.remote.group import run_on_nodes

RTT_COUNT = 20
LIFETIME_S = 900  # the nodes' servers end by themselves after this, should the doctor be interrupted
PORT_LOW, PORT_HIGH = 29000, 32766  # the servers' port pairs (plugin_check's take 20000-28999)
PORT_TRIES = 3
PORT_TAKEN = "port"  # in every reason of pairprobe's serve that a port gives (iperf3's, the echo server's)
ALLREDUCE_TIMEOUT_S = 60
# Local links without link_rate have no speed of their own: this machine's CPUs set it, and it moves
# by a third from one second to the next.  There half the median is the line (the old pairwise check's).
CPU_BOUND_THRESHOLD = 0.5


class PairProbe:
    """Servers on every node between ``start`` and ``stop``; ``measure`` runs one round."""

    def __init__(self, session: ClusterSession, nodes: list[Node], *, seconds: int = 1, together: bool = True):
        self.session, self.seconds, self.together = session, seconds, together
        self.by_name = {n.name: n for n in nodes}
        self._pick_port()

    def _pick_port(self) -> None:
        # iperf3 here, the echo server one above; below Linux's ephemeral ports (32768 and up by default), which
        # any outgoing connection on the node may hold (the leader's own ssh and watch connections did, once)
        self.port = PORT_LOW + 2 * secrets.randbelow((PORT_HIGH - PORT_LOW) // 2)
        self.pidfile = f"/tmp/ct-doctor-probe-{self.port}.pid"

    def _program(self, node: Node, **args: object) -> bytes:
        return program_text("pairprobe", {"addr": node.address, "port": self.port, "echo_port": self.port + 1,
                                          "pidfile": self.pidfile, "lifetime": LIFETIME_S, **args})

    def start(self) -> dict[str, str]:
        """Start the servers; what failed, by node (``no-iperf3``: iperf3 is not installed there). A port some
        node's other processes hold is given up for another, up to PORT_TRIES ports."""
        failed: dict[str, str] = {}
        for _ in range(PORT_TRIES):
            result = run_on_nodes(self.session, list(self.by_name.values()), python_command(), timeout=30,
                                  stdin_data=lambda n: self._program(n, mode="serve"))
            failed = {r.node: (r.stdout.strip().removeprefix("error: ") or r.reason) for r in result.results
                      if not r.ok or r.stdout.strip() != "ready"}
            if not failed or not all(PORT_TAKEN in why for why in failed.values()):
                return failed
            self.stop()
            self._pick_port()
        return failed

    def stop(self) -> None:
        run_on_nodes(self.session, list(self.by_name.values()), python_command(), timeout=20,
                     stdin_data=lambda n: self._program(n, mode="stop"))

    def measure(self, round_: int, pairs: list[Pair]) -> list[Measurement]:
        """One round: every pair's round trip at once, then every pair's bandwidth at once (one pair
        after the other when not ``together``)."""
        if not self.together:
            return [m for p in pairs for m in self._measure(round_, [p])]
        return self._measure(round_, pairs)

    def _measure(self, round_: int, pairs: list[Pair]) -> list[Measurement]:
        srcs = [self.by_name[a] for a, _ in pairs]
        peer = {a: self.by_name[b] for a, b in pairs}
        rtts = run_on_nodes(self.session, srcs, python_command(), timeout=30,
                            stdin_data=lambda n: self._program(n, mode="rtt", peer=peer[n.name].address,
                                                               count=RTT_COUNT, timeout=10))
        bws = run_on_nodes(self.session, srcs, lambda n: iperf_client_line(n, peer[n.name], self.port, self.seconds),
                           timeout=self.seconds + 30)
        out = []
        for r_rtt, r_bw in zip(rtts.results, bws.results):
            rtt, rtt_error = _rtt(r_rtt.stdout, r_rtt.reason if r_rtt.error else "")
            try:
                bits, bw_error = parse_iperf(r_bw.stdout), ""
            except (ValueError, KeyError) as exc:
                bits, bw_error = None, (r_bw.reason if r_bw.error else f"iperf3: {str(exc)[:160]}")
            error = "; ".join(e for e in (bw_error, rtt_error) if e)
            out.append(Measurement(round_, r_bw.node, peer[r_bw.node].name, bits, rtt, error))
        return out


def _rtt(stdout: str, reason: str) -> tuple[float | None, str]:
    """The link's round trip: the fastest of the probe's samples.  A node starved of CPU adds its scheduling
    delays to the median (a clean cluster on a loaded box showed a 4 ms "slow link" twice), never to the
    fastest; a slow link (a delay, a congested path) slows every sample."""
    try:
        doc = json.loads(stdout)
        return float(doc.get("min_s", doc["rtt_s"])), ""
    except (ValueError, KeyError, TypeError):
        said = stdout.strip().removeprefix("error: ")
        return None, f"round trip: {reason or said[:160] or 'no answer'}"


def expected_bits(session: ClusterSession) -> float | None:
    """The rate every link should reach, where the cluster declares one (the local provider's
    ``link_rate``).  EC2's rated bandwidth is not used: one TCP flow there is capped well below it
    (5 Gbit/s, 10 inside a cluster placement group), so it is no floor for iperf3's figure."""
    rate = session.provider.link_rate(session.record)
    return None if rate is None else float(rate)


def _halves(workers: list[str], named: list[str]) -> tuple[list[str], list[str]] | None:
    size = len(workers) // 2
    if size < 2 or len(named) > size:
        return None
    first = named + [w for w in workers if w not in named][: size - len(named)]
    return [w for w in workers if w in first], [w for w in workers if w not in first]


def allreduce_halves(session: ClusterSession, named: list[str], threshold: float) -> dict:
    """MPI_Allreduce (4 MiB of floats) on each half of the workers at once, the named nodes in one half.

    ``{"skipped": why}`` where it cannot run; else each half's nodes and busbw and whether the
    named half ran below ``threshold`` x the other's."""
    cluster = session.record
    deployed = load_record(cluster.name).get("deployed")
    if not deployed:
        return {"skipped": "collnet_bench is not deployed (`clustertool plugin build && clustertool plugin deploy`); "
                           "the confirming round of pairs stands alone"}
    by_name = {n.name: n for n in cluster.workers}
    halves = _halves(list(by_name), [n for n in named if n in by_name])
    if halves is None:
        return {"skipped": "too few workers (or too many named) for two halves of two or more"}
    program = bench_argv(f"{str(deployed['dest']).rstrip('/')}/{BENCH}", (4 << 20, 4 << 20), ["mpi"],
                         iters=2, warmup=1, check=False)
    lines = {}
    for half in halves:
        nodes = [by_name[n] for n in half]
        opts = MpiOptions(command=program, as_root=cluster.user == "root", tag_output=False, unbuffered=False,
                          subnet=cluster_subnet([n.address for n in nodes]))
        lines[half[0]] = shlex.join(build_argv([(n.address, 1) for n in nodes], opts))
    result = run_on_nodes(session, [by_name[h[0]] for h in halves], lambda n: lines[n.name],
                          timeout=ALLREDUCE_TIMEOUT_S)
    out: dict = {"halves": []}
    for half, r in zip(halves, result.results):
        rows = parse_rows(r.stdout)
        out["halves"].append({"nodes": half, "busbw_gb_per_s": rows[-1].busbw if rows else None,
                              "error": "" if rows else (r.reason or r.stderr.strip()[-200:] or "no result row")})
    named_bw, other_bw = (h["busbw_gb_per_s"] for h in out["halves"])
    out["confirmed"] = bool(named_bw is not None and other_bw and named_bw < threshold * other_bw)
    return out


def _with_allreduce(found: list[Finding], halves: dict) -> None:
    if "halves" not in halves:
        return
    named_bw, other_bw = (h["busbw_gb_per_s"] for h in halves["halves"])
    if named_bw is None or other_bw is None:
        return
    for f in found:
        if f.node and f.severity == "error" and f.node in halves["halves"][0]["nodes"]:
            f.message += (f"; allreduce on its half of the nodes: {named_bw:.3f} GB/s busbw vs {other_bw:.3f} "
                          f"on the other half")


def network_check(session: ClusterSession, nodes: list[Node], *, threshold: float = DEFAULT_THRESHOLD,
                  all_pairs: bool = False) -> CheckResult:
    """The search (or every pair) over ``nodes``, as doctor's ``network`` check."""
    report = session.report
    if len(nodes) < 2:
        return CheckResult("network", skipped="fewer than two reachable nodes")
    # Local nodes without link_rate share this machine's CPUs and their links have no rate of their own:
    # pairs measured at once would divide the CPUs between them, so they take turns there.
    together = session.record.provider != "local" or bool(session.record.options.get("link_rate"))
    if not together:
        threshold = min(threshold, CPU_BOUND_THRESHOLD)
    probe = PairProbe(session, nodes, together=together)
    try:
        failed = probe.start()
        missing = sorted(n for n, why in failed.items() if why == "no-iperf3")
        if missing:
            return CheckResult("network", [Finding("network", n, "warning", "iperf3 is not installed: network check "
                                                   "skipped", fix="apt-get install iperf3 (or dnf install iperf3)")
                                           for n in missing])
        if failed:
            fix = f"is /tmp writable, and one port pair of {PORT_LOW}-{PORT_HIGH} free?"
            return CheckResult("network", [Finding("network", n, "error", f"could not start the measuring servers: "
                                                   f"{why}", fix=fix) for n, why in sorted(failed.items())])
        expected = expected_bits(session)

        def on_round(r: int, got: list[Measurement]) -> None:
            report(f"network: round {r}: {len(got)} pair(s) measured")

        result: SearchResult = search([n.name for n in nodes], probe.measure, threshold=threshold,
                                      expected_bits=expected, all_pairs=all_pairs, on_round=on_round)
    finally:
        probe.stop()
    found = bisect_report.findings(result, threshold=threshold, expected_bits=expected)
    data = bisect_report.report_data(result, threshold=threshold, expected_bits=expected)
    named = sorted({f.node for f in found if f.node and f.severity == "error"})
    if named:
        report("network: allreduce on halves of the nodes")
        data["allreduce_halves"] = allreduce_halves(session, named, threshold)
        _with_allreduce(found, data["allreduce_halves"])
    return CheckResult("network", found, data=data)
