#!/usr/bin/env python3
"""Benchmark: the plugin's servers, sharded and ring allreduce vs Open MPI, on shaped local clusters.

For each node count (default 4 and 8, one rank per node): bring up a local cluster whose
links are shaped to RATE (tc tbf at both ends), measure one TCP stream between two nodes
with iperf3 (that is B), build and deploy the plugin, then time 64 MiB float32 allreduce with
`bench allreduce`, which hands each allreduce to the plugin as NCCL's CollNet proxy does:
requests of 256 KiB, 8 outstanding, the oldest tested first. Algorithms: the plugin's servers
(K = n reduction servers; then K = n/2 on a second cluster), sharded and ring, and Open MPI's
default MPI_Allreduce, and in a second run Open MPI's ring (coll_tuned_use_dynamic_rules=1,
coll_tuned_allreduce_algorithm=4). Each run is repeated (--repeat, default 3) and the median
busbw is reported, with busbw/B, against the targets: sharded and ring >= 0.93 B, servers with
K = n >= 1.40 B at n = 4 and >= 1.65 B at n = 8.

    sudo .venv/bin/python bench/allreduce.py [--nodes 4,8] [--rate 200mbit] [--size 64M] [--iters 3] \
        [--servers n,n/2] [--repeat 3]

Results also go to bench/results/allreduce-<time>.json. The cluster is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CT = [sys.executable, "-m", "clustertool"]
OMPI_RING = ["-x", "OMPI_MCA_coll_tuned_use_dynamic_rules=1", "-x", "OMPI_MCA_coll_tuned_allreduce_algorithm=4"]


def ct(args, env, check=True, timeout=3600):
    proc = subprocess.run(CT + args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if check and proc.returncode != 0:
        raise SystemExit(f"clustertool {' '.join(args[:3])} failed ({proc.returncode}):\n{proc.stderr.strip()[-1500:]}")
    return proc


def single_stream_bits(name, env, seconds=5) -> float | None:
    """iperf3 node-1 -> node-2 on the shaped link: B in bits/s (None without iperf3)."""
    addr = json.loads(ct(["inventory", "-c", name, "--format", "json"], env, check=False).stdout or "{}")
    target = None
    for node in (addr.get("nodes") or []):
        if node.get("name") == "node-2":
            target = node.get("address")
    target = target or "10.213.0.2"
    if ct(["exec", "-c", name, "-n", "node-2", "--", "command -v iperf3 >/dev/null && iperf3 -s -1 -D"],
          env, check=False).returncode != 0:
        return None
    time.sleep(0.5)
    out = ct(["exec", "-c", name, "-n", "leader", "--no-live", "--json", "--",
              f"iperf3 -c {target} -t {seconds} -J"], env, check=False)
    try:
        text = json.loads(out.stdout)["results"][0]["stdout"]
        return float(json.loads(text)["end"]["sum_received"]["bits_per_second"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def rows(proc) -> list[dict]:
    try:
        return json.loads(proc.stdout)["rows"]
    except (ValueError, KeyError):
        raise SystemExit(f"bench allreduce gave no rows:\n{proc.stderr.strip()[-1500:]}")


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per algorithm, the run with the median time (so busbw is the median too); #wrong summed."""
    out = []
    for algo in dict.fromkeys(r["algo"] for run in runs for r in run):
        rows = sorted((r for run in runs for r in run if r["algo"] == algo), key=lambda r: r["time_us"])
        if rows:
            pick = dict(rows[(len(rows) - 1) // 2])
            pick["wrong"] = sum(max(r["wrong"], 0) for r in rows)
            pick["runs"] = len(rows)
            pick["times_us"] = [r["time_us"] for r in rows]
            out.append(pick)
    return out


def run_size(nodes: int, rate: str, size: str, iters: int, env, servers: int = 0, full: bool = True,
             repeat: int = 3) -> dict:
    """One cluster of ``nodes`` workers (+ ``servers`` reduction servers); ``full``: every algorithm,
    else only the servers algorithm (a second K on the same n). Each run ``repeat`` times."""
    name = f"arb-{uuid.uuid4().hex[:5]}"
    ct(["up", "--provider", "local", "--nodes", str(nodes), "--name", name, "--link-rate", rate]
       + (["--reduction-servers", str(servers)] if servers else []), env)
    try:
        bits = single_stream_bits(name, env)
        ct(["plugin", "build", "-c", name], env)
        ct(["plugin", "deploy", "-c", name], env)
        base = ["bench", "allreduce", "-c", name, "--sizes", f"{size}:{size}", "-n", str(iters), "--json"]
        algos = ["servers"] if servers else []
        algos += ["sharded", "ring", "mpi"] if full else []
        main = median_rows([rows(ct(base + ["--algo", ",".join(algos)], env, check=False)) for _ in range(repeat)])
        ring = median_rows([rows(ct(base + ["--algo", "mpi"] + OMPI_RING, env, check=False))
                            for _ in range(repeat)]) if full else []
    finally:
        ct(["down", "-c", name, "--yes"], env, check=False)
    results = {(f"servers K={servers}" if r["algo"] == "servers" else r["algo"]): r for r in main}
    if ring:
        results["mpi-ring"] = ring[0]
    return {"nodes": nodes, "rate": rate, "single_stream_bits": bits, "rows": results, "repeat": repeat}


def busbw(row: dict, nodes: int) -> float:
    """GB/s from the time column (the printed busbw has only 4 decimals)."""
    return row["size"] / (row["time_us"] * 1e-6) / 1e9 * 2 * (nodes - 1) / nodes


def report(res: dict) -> list[str]:
    n = res["nodes"]
    for r in res["rows"].values():
        r["busbw"] = busbw(r, n)
    b = res["single_stream_bits"]
    b_gbs = b / 8 / 1e9 if b else None
    lines = [f"{res['nodes']} nodes, links {res['rate']}, single stream B = "
             + (f"{b / 1e6:.1f} Mbit/s" if b else "n/a (no iperf3)")]
    lines.append(f"  {'algorithm':<22} {'busbw GB/s':>10} {'Mbit/s':>8} {'busbw/B':>8} {'#wrong':>6}")
    names = {"sharded": "plugin sharded", "ring": "plugin ring", "mpi": "Open MPI default", "mpi-ring": "Open MPI ring"}
    servers = sorted((k for k in res["rows"] if k.startswith("servers")), key=lambda k: -int(k.split("=")[1]))
    for key in (*servers, "sharded", "ring", "mpi", "mpi-ring"):
        r = res["rows"].get(key)
        if not r:
            continue
        names.setdefault(key, f"plugin {key}")
        ratio = f"{r['busbw'] / b_gbs:.3f}" if b_gbs else "-"
        lines.append(f"  {names[key]:<22} {r['busbw']:>10.5f} {r['busbw'] * 8e3:>8.1f} {ratio:>8} {r['wrong']:>6}")
    if b_gbs:
        checks = [(key, 0.93) for key in ("sharded", "ring") if key in res["rows"]]
        target = {4: 1.40, 8: 1.65}.get(n)
        if target and f"servers K={n}" in res["rows"]:
            checks.append((f"servers K={n}", target))
        parts = [f"{key} >= {t:.2f} B: {'yes' if res['rows'][key]['busbw'] >= t * b_gbs else 'NO'} "
                 f"({res['rows'][key]['busbw'] / b_gbs:.3f})" for key, t in checks]
        if parts:
            lines.append("  targets (medians of " + str(res.get("repeat", 1)) + " runs): " + "; ".join(parts))
    return lines


def server_count(spec: str, n: int) -> int:
    """K from 'n', 'n/2' (any divisor) or a number."""
    spec = spec.strip()
    if spec.startswith("n"):
        return n // int(spec[2:]) if spec[1:2] == "/" else n
    return int(spec)


def merge(results: list[dict]) -> dict:
    """The runs of one n (one cluster per K) as one table."""
    out = dict(results[0], rows={})
    for res in results:
        out["rows"].update(res["rows"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="4,8")
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--servers", default="n,n/2",
                    help="reduction server counts K per node count n, e.g. n,n/2 (one cluster each); 0 or '' for none")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each bench allreduce; the median is reported")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (the local provider makes network namespaces)")
    home = tempfile.mkdtemp(prefix="ct-arbench-")
    env = dict(os.environ, CLUSTERTOOL_HOME=home, CLUSTERTOOL_HOSTFILE_DIR=os.path.join(home, "hostfiles"))
    all_results = []
    for n in [int(x) for x in args.nodes.split(",")]:
        ks = [server_count(k, n) for k in args.servers.split(",") if k.strip()] or [0]
        res = merge([run_size(n, args.rate, args.size, args.iters, env, servers=k, full=(i == 0), repeat=args.repeat)
                     for i, k in enumerate(ks)])
        all_results.append(res)
        print("\n".join(report(res)), flush=True)
    out = REPO / "bench" / "results" / f"allreduce-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(all_results, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
