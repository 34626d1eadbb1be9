#!/usr/bin/env python3
"""Benchmark: getting a dataset onto N nodes, verified (a script, not a test; needs root).

Brings up a local cluster (leader + max(--members) members, every link shaped to --rate),
measures B (one ssh stream between two nodes, dd | ssh cat > /dev/null) and H (the hash the
copy picks, over the dataset on a node: in memory, and reading the files), makes a dataset
of many files totalling S on the leader, then for each N in --members runs, alternating the
order every round:

  chain           clustertool copy --strategy chain               (the default: verified in the stream)
  chain-noverify  clustertool copy --strategy chain --no-verify
  fanout          clustertool copy --strategy fanout              (parallel rsync; verified by rsync)
  scp             for h in ...; do scp -r SRC h:DEST; done        (the seeds' copyclust, on the leader)
  pdcp            pdcp -R ssh -w h1,h2,... -r SRC DEST            (pdsh's parallel copy, on the leader)

Every time is a whole process started here, DEST removed first.  Prints the median of each
as a ratio to S/B, and the CPU seconds the nodes used per copy (a cgroup; the figure that
does not depend on what else the machine runs).  Targets (issue 13): verified chain
<= 1.10 S/B at N = 8 and at N = 16.

    sudo .venv/bin/python bench/copy.py --members 8,16 --size 256M --rounds 3
    sudo .venv/bin/python bench/copy.py --members 2,4,8 --methods chain,fanout,scp,pdcp
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # bench/copy.py would shadow `copy`
sys.path.append(HERE)
from benchlib import REPO, Home, NodeCpu, median, parse_list, parse_size  # noqa: E402

DEFAULT_METHODS = "chain,chain-noverify"


class Bench:
    def __init__(self, home: Home, name: str):
        self.home, self.name = home, name

    def on(self, nodes: str, command: str, **kw):
        return self.home.cli("exec", "-c", self.name, "-n", nodes, "--no-live", "--", command, **kw)

    def out(self, node: str, command: str) -> str:
        return self.on(node, command).stdout.split("\n", 1)[1]  # drop the "---- node" header

    def addresses(self) -> dict[str, str]:
        state = json.loads((Path(self.home.path) / "clusters" / f"{self.name}.json").read_text())
        return {n["name"]: n["address"] for n in state["nodes"]}


def measure_rate(b: Bench, address: str, mib: int) -> float:
    """Bytes/s of one ssh stream from the leader to ``address`` (handshake included)."""
    cmd = (f"s=$(date +%s.%N); dd if=/dev/zero bs=1M count={mib} status=none | "
           f"ssh -T -o Compression=no -c aes128-gcm@openssh.com {address} 'cat > /dev/null'; "
           "e=$(date +%s.%N); echo \"$s $e\"")
    start, end = map(float, b.out("leader", cmd).split())
    return mib * 2**20 / (end - start)


HASH_SPEED = r"""
import os, sys, time
algo, root = fastest_hash(), sys.argv[1]
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
blobs = [open(p, "rb").read() for p in files]
t = time.perf_counter(); h = new_hash(algo)
for b in blobs: h.update(b)
mem = time.perf_counter() - t
t = time.perf_counter()
for p in files:
    h = new_hash(algo)
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""): h.update(block)
disk = time.perf_counter() - t
print(algo, sum(map(len, blobs)), mem, disk)
"""


def measure_hash(b: Bench) -> tuple[str, float, float]:
    """(algo, H in memory, H reading the files) in bytes/s, on the leader, over the dataset:
    the hash copy picks there (nodeprogs/stream.py, sent along)."""
    code = (REPO / "clustertool" / "nodeprogs" / "stream.py").read_text() + HASH_SPEED
    algo, size, mem, disk = b.out("leader", f"python3 -c {shlex.quote(code)} /scratch/ds").split()
    return algo, int(size) / float(mem), int(size) / float(disk)


def make_dataset(b: Bench, size: int) -> tuple[int, int]:
    files = max(16, size // (4 << 20))
    per = size // files
    b.on("leader", f"rm -rf /scratch/ds && mkdir -p /scratch/ds && cd /scratch/ds && "
                   f"for i in $(seq 1 {files}); do d=shard-$((i % 8)); mkdir -p $d; "
                   f"head -c {per} /dev/urandom > \"$d/sample $i.bin\"; done", timeout=900)
    return files, files * per


def run_one(b: Bench, method: str, targets: list[str], addrs: dict[str, str]) -> float:
    sel = ",".join(targets)
    b.on(sel, "rm -rf /scratch/dst")
    hosts = [addrs[t] for t in targets]
    copy = ("copy", "-c", b.name, "--nodes", sel)
    if method == "chain":
        return b.home.timed(*copy, "--strategy", "chain", "/scratch/ds", "/scratch/dst")
    if method == "chain-noverify":
        return b.home.timed(*copy, "--strategy", "chain", "--no-verify", "/scratch/ds", "/scratch/dst")
    if method == "fanout":
        return b.home.timed(*copy, "--strategy", "fanout", "/scratch/ds", "/scratch/dst")
    if method == "scp":
        loop = "; ".join(f"scp -r -q /scratch/ds {h}:/scratch/dst" for h in hosts)
        return b.home.timed("exec", "-c", b.name, "-n", "leader", "--no-live", "--", f"set -e; {loop}")
    if method == "pdcp":
        b.on(sel, "mkdir -p /scratch/dst")
        cmd = f"PDSH_RCMD_TYPE=ssh pdcp -f 64 -w {shlex.quote(','.join(hosts))} -r /scratch/ds /scratch/dst"
        return b.home.timed("exec", "-c", b.name, "-n", "leader", "--no-live", "--", cmd)
    raise SystemExit(f"unknown method {method!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default="8,16", help="member counts N, e.g. 8,16")
    ap.add_argument("--size", default="256M", help="dataset size S (e.g. 256M, 1G)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (each runs every method, order rotated)")
    ap.add_argument("--rate", default="200mbit", help="every link's rate")
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="chain,chain-noverify,fanout,scp,pdcp")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (local provider)", file=sys.stderr)
        return 2
    members, methods, size = parse_list(args.members), args.methods.split(","), parse_size(args.size)
    home = Home("ct-bench-copy-")
    b = Bench(home, f"bcopy-{uuid.uuid4().hex[:4]}")
    cpu = None
    rows: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    try:
        home.cli("up", "--provider", "local", "--nodes", str(max(members) + 1), "--name", b.name,
                 "--link-rate", args.rate)
        cpu = NodeCpu(b.name)
        addrs = b.addresses()
        rate = measure_rate(b, addrs["node-2"], 128)
        files, total = make_dataset(b, size)
        algo, h_mem, h_disk = measure_hash(b)
        ideal = total / rate
        print(f"B = {rate / 1e6:.1f} MB/s (one ssh stream, aes128-gcm); S = {total / 2**20:.0f} MiB in {files} files; "
              f"S/B = {ideal:.2f} s")
        print(f"H = {h_mem / 1e6:.0f} MB/s ({algo}, in memory), {h_disk / 1e6:.0f} MB/s reading the files: "
              f"S/H = {total / h_mem:.2f} s / {total / h_disk:.2f} s = {total / h_mem / ideal:.3f} / "
              f"{total / h_disk / ideal:.3f} x S/B", flush=True)
        for rnd in range(args.rounds):
            for n in members:
                targets = [f"node-{i}" for i in range(2, n + 2)]
                order = methods[rnd % len(methods):] + methods[:rnd % len(methods)]
                for m in order:
                    before = cpu.seconds()
                    t = run_one(b, m, targets, addrs)
                    used = None if before is None else cpu.seconds() - before
                    rows.setdefault((m, n), []).append((t, used))
                    note = "" if used is None else f"  nodes' CPU {used:5.1f} s"
                    print(f"  round {rnd + 1} N={n:<3} {m:<15} {t:7.2f} s  {t / ideal:5.3f} x S/B{note}", flush=True)
        print("\n| method | N | median (s) | median / (S/B) | runs | nodes' CPU per copy (s) |")
        print("|---|---|---|---|---|---|")
        summary = []
        for (m, n), got in sorted(rows.items(), key=lambda kv: (kv[0][1], methods.index(kv[0][0]))):
            t = median([g[0] for g in got])
            used = [g[1] for g in got if g[1] is not None]
            cpu_s = f"{median(used):.1f}" if used else "-"
            print(f"| {m} | {n} | {t:.2f} | {t / ideal:.3f} | {len(got)} | {cpu_s} |")
            summary.append({"method": m, "n": n, "median_s": t, "ratio": t / ideal, "runs": [g[0] for g in got],
                            "node_cpu_s": [g[1] for g in got]})
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"B": rate, "S": total, "ideal_s": ideal, "hash": algo, "H_mem": h_mem, "H_disk": h_disk,
                           "rows": summary}, fh, indent=1)
    finally:
        home.cli("down", "-c", b.name, "--yes", check=False)
        if cpu is not None:
            cpu.remove()
        home.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
