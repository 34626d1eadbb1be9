#!/usr/bin/env python3
"""Benchmark: time to name the slow node, `doctor --bisect` against measuring every pair.

Brings up local clusters (real sshd nodes in namespaces) of 8, 16 and 32 nodes with 200 Mbit/s
links (tc tbf at both ends of every node's veth), shapes one node's link to 50 Mbit/s, then, in
alternating rounds, times whole `clustertool` processes:

  doctor --bisect              rounds of disjoint pairs chosen from what the last round found:
                               at most ceil(log2(n)) + 1 rounds
  doctor --bisect --all-pairs  every pair, n - 1 rounds of disjoint pairs (n when odd): what running
                               nccl-tests (or iperf3) on every pair by hand amounts to

Both measure each pair the same way (all pairs of a round at once; TCP round trips, then
`iperf3 --bidir` for 1 s), so the difference is the number of rounds.  Reported per size: rounds,
seconds (medians of the rounds of this benchmark, whole process and the network check alone), the
ratio, and whether the slow node was named and only it.

    sudo .venv/bin/python bench/doctor_bisect.py [--nodes 8,16,32] [--rounds 2] [--json out.json]

Targets: <= ceil(log2(n)) + 1 rounds, and <= 0.3x the all-pairs time at 16 nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))   # at the end: bench/copy.py must not shadow copy
from benchlib import Home  # noqa: E402

from clustertool.providers.local import net  # noqa: E402

RATE, SLOW = "200mbit", "50mbit"
MODES = {"bisect": ("--bisect",), "all pairs": ("--bisect", "--all-pairs")}


def shape(home: Home, name: str, index: int, rate: str) -> None:
    """Both ends of node ``index``'s link (the host's veth, the node's eth0) at ``rate``."""
    state = json.loads(Path(home.path, "clusters", f"{name}.json").read_text())
    veth = net.veth_name(state["provider_state"]["slot"], index)
    for argv, dev in ((net.tc_batch_argv(), veth), (net.tc_batch_argv(net.netns_name(name, index)), net.NODE_IFACE)):
        subprocess.run(argv, input="\n".join(net.shaping_lines(dev, rate, None)) + "\n", text=True, check=True)


def one(home: Home, name: str, args: tuple[str, ...], slow: str) -> dict:
    t0 = time.monotonic()
    proc = home.cli("doctor", "-c", name, "--json", *args, check=False, timeout=1200)
    took = time.monotonic() - t0
    report = json.loads(proc.stdout)
    network = next(c for c in report["checks"] if c["name"] == "network")
    named = sorted({f["node"] or f["data"].get("link") for f in network["findings"]
                    if f["severity"] in ("warning", "error")})
    return {"seconds": took, "check_seconds": network["seconds"], "rounds": network["data"]["rounds"],
            "named": named, "right": named == [slow]}


def bench_size(home: Home, nodes: int, rounds: int) -> dict:
    name = f"bb{nodes}"
    slow_index = nodes // 2 + 1
    home.cli("up", "--provider", "local", "--nodes", str(nodes), "--name", name, "--link-rate", RATE)
    try:
        shape(home, name, slow_index, SLOW)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(rounds):
            for mode, args in MODES.items():
                runs[mode].append(one(home, name, args, f"node-{slow_index}"))
        return {"slow_node": f"node-{slow_index}", "runs": runs}
    finally:
        home.cli("down", "-c", name, "--yes", check=False)


def summary(res: dict) -> dict:
    out = {}
    for mode, runs in res["runs"].items():
        out[mode] = {"rounds": max(r["rounds"] for r in runs), "seconds": statistics.median(r["seconds"] for r in runs),
                     "check_seconds": statistics.median(r["check_seconds"] for r in runs),
                     "right": all(r["right"] for r in runs), "named": runs[-1]["named"]}
    return out


def report(results: dict, rounds: int) -> None:
    print(f"\nslow node at {SLOW} among {RATE} links; medians of {rounds} alternating run(s), whole process "
          "(network check alone)")
    print(f"{'nodes':>5} {'mode':10} {'rounds':>6} {'budget':>6} {'seconds':>16} {'x all pairs':>12}  named")
    for nodes, res in results.items():
        s = summary(res)
        base = s["all pairs"]
        for mode, row in s.items():
            budget = math.ceil(math.log2(nodes)) + 1 if mode == "bisect" else nodes - 1 + nodes % 2
            ratio = f"{row['seconds'] / base['seconds']:.2f} ({row['check_seconds'] / base['check_seconds']:.2f})"
            print(f"{nodes:>5} {mode:10} {row['rounds']:>6} {budget:>6} {row['seconds']:7.1f} "
                  f"({row['check_seconds']:5.1f}s) {ratio:>12}  {','.join(row['named']) or '-'}"
                  + ("" if row["right"] else f"  WRONG (want {res['slow_node']})"))
    print("\ntargets: bisect <= ceil(log2(n)) + 1 rounds; <= 0.3x the all-pairs time at 16 nodes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="8,16,32")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each mode per size")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    home = Home("ct-bench-bisect-")   # a throw-away clustertool home
    results = {}
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            results[n] = bench_size(home, n, args.rounds)
    finally:
        home.remove()
    report(results, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({str(n): {**r, "summary": summary(r)} for n, r in results.items()},
                                              indent=2))


if __name__ == "__main__":
    main()
