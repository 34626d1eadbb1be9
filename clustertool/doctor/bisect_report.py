"""Findings and JSON data from a search of the slow node or link (doctor/bisect.py): pure."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from clustertool.doctor.bisect import DEFAULT_THRESHOLD, METRICS, Measurement, Pair, SearchResult, key, round_robin
from clustertool.doctor.findings import Finding


def _mbit(v: float) -> str:
    return f"{v / 1e6:.0f} Mbit/s" if v < 10e9 else f"{v / 1e9:.1f} Gbit/s"


def _ms(v: float) -> str:
    return f"{v * 1e3:.2f} ms" if math.isfinite(v) else "no answer"


def _errors(measurements: Sequence[Measurement], pairs: set[Pair]) -> str:
    seen = sorted({m.error for m in measurements if m.pair in pairs and m.error})
    return f" ({'; '.join(seen)[:200]})" if seen else ""


NODE_FIX = ("`clustertool cordon {n}` keeps jobs off it until it is repaired; `clustertool reboot --nodes {n}`; "
            "if it stays slow, check its network interface (`ethtool -S`, the ENA/EFA driver), its instance type "
            "and any tc shaping, or replace the node")
LINK_FIX = ("check the path between {a} and {b}: cable and switch port on your own hardware; on AWS both nodes' "
            "ENIs/EFA, the security group (all traffic between cluster nodes allowed) and that both are in the same "
            "cluster placement group; `clustertool cordon {b}` keeps jobs off the link meanwhile")


def _node_finding(metric: str, node: str, others: list[str], r: SearchResult) -> Finding:
    a = r.assessment
    mine = {key(node, o) for o in others}
    v = statistics.median(a.value[metric][p] for p in mine)
    ref = a.reference[metric] or 0.0
    listing = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
    if metric == "bandwidth":
        what = (f"bandwidth test failed with every partner{_errors(r.measurements, mine)}" if v == 0 else
                f"slow link: {_mbit(v)} with every partner vs the cluster's {_mbit(ref)} ({v / ref:.0%})")
    else:
        what = f"high latency: {_ms(v)} round trip with every partner vs the cluster's {_ms(ref)}"
    data = {"metric": metric, "partners": others, "value": v if math.isfinite(v) else None, "median": ref,
            "confirmed": r.confirmed}
    return Finding("network", node, "error", f"{what}; partners {listing}, each at full rate with other nodes",
                   fix=NODE_FIX.format(n=node), data=data)


def _link_finding(metric: str, pair: Pair, r: SearchResult) -> Finding:
    a = r.assessment
    v, ref = a.value[metric][pair], a.reference[metric] or 0.0
    x, y = sorted(pair, key=a.nodes.index)  # in the cluster's order: node-9 before node-10
    n = a.counts[pair]
    what = (f"{_mbit(v)} vs the cluster's {_mbit(ref)} ({v / ref:.0%})" if metric == "bandwidth" else
            f"{_ms(v)} round trip vs the cluster's {_ms(ref)}")
    return Finding("network", None, "error",
                   f"slow link {x} <-> {y}: {what}, in {n} of {n} measurements{_errors(r.measurements, {pair})}; "
                   "both nodes run at full rate with other partners",
                   fix=LINK_FIX.format(a=x, b=y), data={"metric": metric, "link": f"{x}<->{y}", "nodes": [x, y],
                                                        "value": v if math.isfinite(v) else None, "median": ref})


def _unresolved(metric: str, r: SearchResult) -> list[Finding]:
    a = r.assessment
    out = []
    for node, others in sorted(a.node_suspects[metric].items()):
        slow = sum(a.counts[key(node, o)] for o in others)
        out.append(Finding("network", node, "warning" if slow >= 2 else "info",
                           f"{metric}: slow with {', '.join(others)} ({slow} measurement(s)), not narrowed down "
                           f"in {r.rounds} round(s)",
                           fix="run `clustertool doctor --bisect` again, or `--bisect --all-pairs` to measure "
                               "every pair", data={"metric": metric, "partners": others}))
    for x, y in sorted(sorted(p, key=a.nodes.index) for p in a.link_suspects[metric]):
        out.append(Finding("network", None, "info",
                           f"{metric}: {x} <-> {y} was slow once and not measured again within {r.rounds} round(s)",
                           fix="run `clustertool doctor --bisect` again",
                           data={"metric": metric, "link": f"{x}<->{y}"}))
    return out


def findings(r: SearchResult, *, threshold: float = DEFAULT_THRESHOLD,
             expected_bits: float | None = None) -> list[Finding]:
    """What the search named: nodes and links (errors), what it could not settle (warning or info),
    and a cluster running below its expected rate (warning)."""
    a = r.assessment
    out: list[Finding] = []
    if r.measurements and a.reference["bandwidth"] in (None, 0.0):
        why = _errors(r.measurements, set(a.counts))
        return [Finding("network", None, "error", f"no bandwidth test succeeded{why}",
                        fix="check that iperf3 runs on every node and that nodes reach each other on ports above 1024")]
    for metric in METRICS:
        out += [_node_finding(metric, n, others, r) for n, others in sorted(a.named_nodes[metric].items())]
        out += [_link_finding(metric, p, r) for p in sorted(a.named_links[metric])]
        out += _unresolved(metric, r)
    ref = a.reference["bandwidth"]
    if expected_bits and ref is not None and ref < threshold * expected_bits:
        out.append(Finding("network", None, "warning",
                           f"the cluster's median link runs at {_mbit(ref)}, {ref / expected_bits:.0%} of the "
                           f"expected {_mbit(expected_bits)}",
                           fix="every node is slow alike: check the instance type, placement group and the "
                               "interfaces' settings (MTU, driver) rather than one node",
                           data={"median": ref, "expected": expected_bits}))
    return out


def node_medians(r: SearchResult) -> dict[str, float]:
    """Each node's median bandwidth over its pairs (best figure of each pair)."""
    per: dict[str, list[float]] = {}
    for (x, y), v in r.assessment.value["bandwidth"].items():
        per.setdefault(x, []).append(v)
        per.setdefault(y, []).append(v)
    return {n: statistics.median(v) for n, v in per.items()}


def report_data(r: SearchResult, *, threshold: float, expected_bits: float | None) -> dict:
    """The check's JSON data: every measurement, the per-pair and per-node figures, the rounds."""
    a = r.assessment
    n = len(a.nodes)
    ref_bw, ref_rtt = a.reference["bandwidth"], a.reference["latency"]
    summary = (f"{r.rounds} round(s) of pairs (budget {r.max_rounds}, all pairs: {len(round_robin(a.nodes))}), "
               f"{len(a.counts)} of {n * (n - 1) // 2} pairs measured"
               + (f"; median {_mbit(ref_bw)}" if ref_bw else "")
               + (f", {_ms(ref_rtt)} round trip" if ref_rtt is not None else ""))
    return {
        "summary": summary, "mode": "all-pairs" if r.all_pairs else "bisect",
        "rounds": r.rounds, "max_rounds": r.max_rounds, "confirmed": r.confirmed,
        "threshold": threshold, "expected_bits_per_s": expected_bits,
        "median_bits_per_s": ref_bw, "median_rtt_s": ref_rtt,
        "pairs_bits_per_s": {f"{x}<->{y}": v for (x, y), v in sorted(a.value["bandwidth"].items())},
        "node_median_bits_per_s": node_medians(r),
        "matchings": [[f"{x}<->{y}" for x, y in pairs] for pairs in r.matchings],
        "measurements": [vars(m).copy() for m in r.measurements],
    }
