#!/usr/bin/env python3
"""Benchmark: getting a dataset onto N nodes (a script, not a test; needs root).

Brings up a local cluster (leader + 8 members, every link shaped to --link-rate), measures
the effective single-stream rate B (dd | ssh cat > /dev/null between two nodes), makes a
dataset of many files totalling S on the leader, then for N = 2, 4, 8 runs, alternating:

  chain    clustertool copy --strategy chain --no-verify   (pipelined relay)
  fanout   clustertool copy --strategy fanout --no-verify  (parallel rsync from the leader)
  scp      for h in ...; do scp -r SRC h:DEST; done        (the seeds' copyclust, on the leader)
  pdcp     pdcp -R ssh -w h1,h2,... -r SRC DEST            (pdsh's parallel copy, on the leader)

and prints each wall time (whole processes, started from this machine) with its ratio to
S/B.  Targets (issue 4): chain <= 1.15 S/B at N = 8 and flat in N; >= 6x the scp loop at 8.

    sudo .venv/bin/python bench/copy.py [--size-mib 256] [--rate 200mbit] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clustertool"]


class Bench:
    def __init__(self, name: str, env: dict):
        self.name, self.env = name, env

    def cli(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        proc = subprocess.run(CLI + list(args), env=self.env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise SystemExit(f"failed: clustertool {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return proc

    def on(self, nodes: str, command: str, **kw) -> subprocess.CompletedProcess:
        return self.cli("exec", "-c", self.name, "-n", nodes, "--no-live", "--", command, **kw)

    def timed(self, *args: str) -> float:
        t0 = time.monotonic()
        self.cli(*args)
        return time.monotonic() - t0

    def addresses(self) -> dict[str, str]:
        state = json.loads((Path(self.env["CLUSTERTOOL_HOME"]) / "clusters" / f"{self.name}.json").read_text())
        return {n["name"]: n["address"] for n in state["nodes"]}


def measure_rate(b: Bench, a: str, mib: int, cipher: str | None) -> float:
    """Bytes/s of one ssh stream from node-1 to address a (includes the ssh handshake)."""
    c = f"-c {cipher} " if cipher else ""
    cmd = (f"s=$(date +%s.%N); dd if=/dev/zero bs=1M count={mib} status=none | "
           f"ssh -T -o Compression=no {c}{a} 'cat > /dev/null'; e=$(date +%s.%N); echo \"$s $e\"")
    out = b.on("leader", cmd).stdout.split("\n", 1)[1].split()
    return mib * 2**20 / (float(out[1]) - float(out[0]))


def make_dataset(b: Bench, size_mib: int) -> tuple[int, int]:
    files = max(16, size_mib // 4)
    per = size_mib * 2**20 // files
    cmd = (f"rm -rf /scratch/ds && mkdir -p /scratch/ds && cd /scratch/ds && "
           f"for i in $(seq 1 {files}); do d=shard-$((i % 8)); mkdir -p $d; "
           f"head -c {per} /dev/urandom > \"$d/sample $i.bin\"; done && du -sb /scratch/ds")
    b.on("leader", cmd, timeout=600)
    return files, files * per


def run_one(b: Bench, method: str, targets: list[str], addrs: dict[str, str], extra: tuple = ()) -> float:
    sel = ",".join(targets)
    b.on(sel, "rm -rf /scratch/dst")
    hosts = [addrs[t] for t in targets]
    if method in ("chain", "fanout"):
        return b.timed("copy", "-c", b.name, "--nodes", sel, "--strategy", method, "--no-verify",
                       *extra, "/scratch/ds", "/scratch/dst")
    if method == "chain+verify":
        return b.timed("copy", "-c", b.name, "--nodes", sel, "--strategy", "chain",
                       "/scratch/ds", "/scratch/dst")
    if method == "scp":
        loop = "; ".join(f"scp -r -q /scratch/ds {h}:/scratch/dst" for h in hosts)
        return b.timed("exec", "-c", b.name, "-n", "leader", "--no-live", "--", f"set -e; {loop}")
    if method == "pdcp":
        b.on(sel, "mkdir -p /scratch/dst")
        cmd = f"PDSH_RCMD_TYPE=ssh pdcp -f 64 -w {shlex.quote(','.join(hosts))} -r /scratch/ds /scratch/dst"
        return b.timed("exec", "-c", b.name, "-n", "leader", "--no-live", "--", cmd)
    raise ValueError(method)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--ns", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--methods", default="chain,fanout,scp,pdcp")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (local provider)", file=sys.stderr)
        return 2
    ns = [int(x) for x in args.ns.split(",")]
    home = tempfile.mkdtemp(prefix="ct-bench-copy-")
    env = dict(os.environ, CLUSTERTOOL_HOME=home, CLUSTERTOOL_HOSTFILE_DIR=f"{home}/hostfiles",
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    b = Bench(f"bcopy-{uuid.uuid4().hex[:4]}", env)
    rows: list[tuple] = []
    try:
        b.cli("up", "--provider", "local", "--nodes", str(max(ns) + 1), "--name", b.name, "--link-rate", args.rate)
        addrs = b.addresses()
        rates = {c or "default": measure_rate(b, addrs["node-2"], 128, c)
                 for c in ("aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com", None)}
        rate = rates["aes128-gcm@openssh.com"]
        files, size = make_dataset(b, args.size_mib)
        ideal = size / rate
        print("B (one ssh stream, 128 MiB): " + ", ".join(f"{k} {v / 1e6:.1f} MB/s" for k, v in rates.items()))
        print(f"S = {size / 2**20:.0f} MiB in {files} files; S/B = {ideal:.1f} s", flush=True)
        methods = args.methods.split(",")
        for rnd in range(args.rounds):
            for n in ns:
                targets = [f"node-{i}" for i in range(2, n + 2)]
                order = methods[rnd % len(methods):] + methods[:rnd % len(methods)]
                for m in order:
                    t = run_one(b, m, targets, addrs)
                    rows.append((m, n, t, t / ideal))
                    print(f"  N={n} {m:<13} {t:7.1f} s  {t / ideal:5.2f} x S/B", flush=True)
                if n == max(ns) and rnd == 0:
                    for m, extra in (("chain+verify", ()), ("chain", ("--cipher", "chacha20-poly1305@openssh.com"))):
                        t = run_one(b, m, targets, addrs, extra)
                        label = m if not extra else "chain/chacha20"
                        rows.append((label, n, t, t / ideal))
                        print(f"  N={n} {label:<13} {t:7.1f} s  {t / ideal:5.2f} x S/B", flush=True)
        print("\n| method | N | time (s) | ratio to S/B |\n|---|---|---|---|")
        for m, n, t, r in sorted(rows, key=lambda r: (r[1], r[0])):
            print(f"| {m} | {n} | {t:.1f} | {r:.2f} |")
        by = {(m, n): t for m, n, t, _ in rows}
        n8 = max(ns)
        if ("chain", n8) in by and ("scp", n8) in by:
            print(f"\nscp loop / chain at N={n8}: {by[('scp', n8)] / by[('chain', n8)]:.1f}x")
    finally:
        b.cli("down", "-c", b.name, "--yes", check=False)
        subprocess.run(["rm", "-rf", home])
    return 0


if __name__ == "__main__":
    sys.exit(main())
