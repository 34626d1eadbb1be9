#!/usr/bin/env python3
"""Benchmark: `clustertool exec -- true` vs pdsh vs a sequential ssh loop, on 32 local nodes.

Brings up a local cluster (real sshd in namespaces), then times whole processes, alternating
the contenders, several rounds, and prints medians and ratios to pdsh:

  cold clustertool exec   no ControlMaster running (each node: a fresh SSH handshake)
  warm clustertool exec   a repeated call: connections reused (ControlMaster, ControlPersist)
  pdsh -R ssh -f N        fresh ssh per node, N at once (what users reach for)
  ssh loop                for h in ...; do ssh $h true; done (the seeds' runclust)

pdsh and the loop use the cluster's ssh config (pinned host keys, the cluster key) minus what
clustertool tunes (ControlMaster, KexAlgorithms, HostKeyAlgorithms): that is what they do for
users. One more row, pdsh given clustertool's key-exchange choice too, shows how much of the gain
is that choice.

    sudo .venv/bin/python bench/exec_fanout.py [--nodes 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CT = [sys.executable, "-m", "clustertool"]


def sh(argv, env, check=True, **kw):
    return subprocess.run(argv, env=env, check=check, capture_output=True, text=True, **kw)


def timed(argv, env) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]}... failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if not shutil.which("pdsh"):
        raise SystemExit("pdsh not found: apt-get install pdsh")
    home = tempfile.mkdtemp(prefix="ct-bench-exec-")
    env = dict(os.environ, CLUSTERTOOL_HOME=home, CLUSTERTOOL_HOSTFILE_DIR=f"{home}/hostfiles",
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    name = "bexec"
    t0 = time.perf_counter()
    sh(CT + ["up", "--provider", "local", "--nodes", str(args.nodes), "--name", name], env)
    up_s = time.perf_counter() - t0
    try:
        results = run_rounds(name, home, env, args)
    finally:
        sh(CT + ["down", "-c", name, "--yes"], env, check=False)
        shutil.rmtree(home, ignore_errors=True)
    report(results, args, up_s)


def run_rounds(name, home, env, args):
    cfg = f"{home}/clusters/{name}/ssh_config"
    plain = f"{home}/plain_ssh_config"
    tuned = ("ControlMaster", "ControlPath", "ControlPersist", "KexAlgorithms", "HostKeyAlgorithms")
    Path(plain).write_text("".join(line for line in open(cfg, encoding="utf-8").readlines()
                                   if line.strip().split(" ")[0] not in tuned))
    kex = next(line.split()[1] for line in open(cfg, encoding="utf-8") if line.strip().startswith("KexAlgorithms"))
    aliases = [f"{name}-node-{i}" for i in range(1, args.nodes + 1)]
    nomux = ["-F", plain, "-o", "ControlMaster=no", "-o", "ControlPath=none"]
    pdsh_env = dict(env, PDSH_SSH_ARGS=" ".join(nomux) + " -l%u %h")
    pdsh_kex_env = dict(env, PDSH_SSH_ARGS=" ".join(nomux) + f" -o KexAlgorithms={kex} -l%u %h")
    pdsh = ["pdsh", "-R", "ssh", "-f", str(args.nodes), "-w", ",".join(aliases), "true"]
    loop = ["sh", "-c", "for h in " + " ".join(aliases) + f"; do ssh {' '.join(nomux)} $h true || exit 1; done"]
    exec_ = CT + ["exec", "-c", name, "--no-live", "--", "true"]
    close = ["sh", "-c", " ".join(f"ssh -F {cfg} -O exit {a} 2>/dev/null;" for a in aliases) + " true"]
    times = {"clustertool exec (cold)": [], "clustertool exec (warm)": [], "pdsh": [],
             "pdsh + clustertool's kex": [], "ssh loop": []}
    for _ in range(args.rounds):
        subprocess.run(close, env=env)
        times["clustertool exec (cold)"].append(timed(exec_, env))
        times["clustertool exec (warm)"].append(timed(exec_, env))
        times["pdsh"].append(timed(pdsh, pdsh_env))
        times["pdsh + clustertool's kex"].append(timed(pdsh, pdsh_kex_env))
        times["ssh loop"].append(timed(loop, env))
    return times


def report(times, args, up_s):
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["pdsh"]
    print(f"\n{args.nodes} local nodes (up took {up_s:.1f}s), {args.rounds} alternating rounds, medians:\n")
    print(f"{'contender':28} {'median s':>9} {'x pdsh':>8}")
    for key, value in med.items():
        print(f"{key:28} {value:9.3f} {value / base:8.2f}")
    print("\ntargets: cold <= 0.50x pdsh, warm <= 0.25x pdsh")
    if args.json:
        Path(args.json).write_text(json.dumps({"nodes": args.nodes, "runs": times, "median": med}, indent=2))


if __name__ == "__main__":
    main()
