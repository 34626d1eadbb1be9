#!/usr/bin/env python3
"""Benchmark: how clustertool's own cost grows with the cluster (a script, not a test; needs root).

For each size N in --sizes (default 8, 32, 128, 254), brings up a local cluster of N nodes and
times, as whole processes started here:

  up                      clustertool up --provider local --nodes N
  exec cold               clustertool exec -- true, no ControlMaster running (fresh handshakes;
                          timed once the previous round's masters are gone and their
                          connections closed on the nodes)
  exec warm               the same again (connections reused)
  pdsh                    pdsh -R ssh -f N -w <every node> true, through the cluster's ssh config
                          minus what clustertool tunes (ControlMaster, KexAlgorithms): what users run
  copy                    clustertool copy of 64 MiB (16 files) from the leader to every member
                          (--strategy chain, verified; unshaped links: this measures the tool)
  doctor                  clustertool doctor --check reach,ssh-mesh
  down                    clustertool down --yes

exec cold, exec warm and pdsh alternate for --rounds rounds (medians).  Prints a table with
the ratios to pdsh and how each operation grows (the exponent of time ~ N^k between the two
largest sizes), and draws time against nodes, log-log, into --png.  Targets (issue 13), at
254 nodes: exec cold <= 0.3x pdsh, warm <= 0.1x pdsh; up and down no worse than linear.

Every cluster comes down (try/finally); afterwards the script lists any namespace of its own
that is left (there should be none).  254 nodes need ~6 GiB of memory and 16 GiB of disk
(the copy: 64 MiB on each node).

    sudo .venv/bin/python bench/scale.py --sizes 8,32,128,254 --rounds 3 --png results/scale/scale.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # bench/copy.py would shadow `copy`
sys.path.append(HERE)
from benchlib import REPO, Home, median, netns_of, parse_list, timed_argv  # noqa: E402

OPS = ("up", "exec cold", "exec warm", "pdsh", "copy", "doctor", "down")


def pdsh_env(home: Home, name: str) -> dict:
    """pdsh as users run it: the cluster's ssh config without clustertool's tuning."""
    cfg = Path(home.path) / "clusters" / name / "ssh_config"
    plain = Path(home.path) / f"{name}-plain_ssh_config"
    tuned = ("ControlMaster", "ControlPath", "ControlPersist", "KexAlgorithms", "HostKeyAlgorithms")
    plain.write_text("".join(ln for ln in cfg.read_text().splitlines(keepends=True)
                             if ln.strip().split(" ")[0] not in tuned))
    args = f"-F {plain} -o ControlMaster=no -o ControlPath=none -l%u %h"
    return dict(home.env, PDSH_SSH_ARGS=args)


def control_dir(home: Home, name: str) -> Path:
    """The cluster's ControlMaster sockets (state.ClusterPaths.control_dir, for this home)."""
    root = Path(home.path) / "clusters" / name
    return Path(tempfile.gettempdir()) / f"ct-{hashlib.sha1(str(root).encode()).hexdigest()[:10]}"


def close_masters(home: Home, name: str, n: int, settle: float = 2.0) -> None:
    """No master left: each asked to exit, then waited for until its socket is gone, then
    ``settle`` seconds for the masters' connections to finish closing on the nodes, so that a
    cold exec is timed from a quiet cluster (as pdsh is), not beside n connections closing."""
    cfg = Path(home.path) / "clusters" / name / "ssh_config"
    procs = [subprocess.Popen(["ssh", "-F", str(cfg), "-O", "exit", f"{name}-node-{i}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i in range(1, n + 1)]
    for p in procs:
        p.wait()
    sockets = control_dir(home, name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sockets.is_dir() and any(sockets.iterdir()):
        time.sleep(0.1)
    time.sleep(settle)


def one_size(home: Home, n: int, rounds: int, say) -> dict[str, float]:
    name = f"bscale{n}-{uuid.uuid4().hex[:4]}"
    got: dict[str, list[float]] = {op: [] for op in OPS}
    up = False
    try:
        got["up"].append(home.timed("up", "--provider", "local", "--nodes", str(n), "--name", name))
        up = True
        say(f"N={n}: up {got['up'][0]:.1f} s")
        env = pdsh_env(home, name)
        pdsh = ["pdsh", "-R", "ssh", "-f", str(n), "-w", ",".join(f"{name}-node-{i}" for i in range(1, n + 1)), "true"]
        exec_ = ("exec", "-c", name, "--no-live", "--", "true")
        for _ in range(rounds):
            close_masters(home, name, n)
            got["exec cold"].append(home.timed(*exec_))
            got["exec warm"].append(home.timed(*exec_))
            got["pdsh"].append(timed_argv(pdsh, env))
        say(f"N={n}: exec cold {median(got['exec cold']):.2f} s, warm {median(got['exec warm']):.2f} s, "
            f"pdsh {median(got['pdsh']):.2f} s")
        home.cli("exec", "-c", name, "-n", "leader", "--no-live", "--", "mkdir -p /scratch/ds && "
                 "for i in $(seq 1 16); do head -c 4194304 /dev/urandom > /scratch/ds/f$i; done")
        got["copy"].append(home.timed("copy", "-c", name, "--strategy", "chain", "/scratch/ds", "/scratch/dst"))
        got["doctor"].append(home.timed("doctor", "-c", name, "--check", "reach,ssh-mesh"))
        say(f"N={n}: copy {got['copy'][0]:.1f} s, doctor {got['doctor'][0]:.1f} s")
    finally:
        if up or netns_of(name):
            got["down"].append(home.timed("down", "-c", name, "--yes", check=False))
    left = netns_of(name)
    if left:
        say(f"N={n}: LEFT BEHIND: {len(left)} namespace(s), e.g. {left[0]}")
    return {op: median(v) for op, v in got.items() if v}


def exponent(rows: dict[int, dict[str, float]], op: str) -> float | None:
    """k in time ~ N^k, from the two largest sizes that have the figure."""
    sizes = sorted(n for n in rows if op in rows[n] and rows[n][op] > 0)
    if len(sizes) < 2:
        return None
    a, b = sizes[-2], sizes[-1]
    return math.log(rows[b][op] / rows[a][op]) / math.log(b / a)


def table(rows: dict[int, dict[str, float]]) -> str:
    head = "| nodes | " + " | ".join(OPS) + " | cold / pdsh | warm / pdsh |"
    lines = [head, "|" + "---|" * (len(OPS) + 3)]
    for n in sorted(rows):
        r = rows[n]
        cells = [f"{r[op]:.2f}" if op in r else "-" for op in OPS]
        ratios = [f"{r[k] / r['pdsh']:.2f}" if k in r and r.get("pdsh") else "-" for k in ("exec cold", "exec warm")]
        lines.append(f"| {n} | " + " | ".join(cells + ratios) + " |")
    growth = [f"{op} N^{k:.2f}" for op in OPS if (k := exponent(rows, op)) is not None]
    return "\n".join(lines) + "\n\ngrowth between the two largest sizes (time ~ N^k): " + ", ".join(growth)


def chart(rows: dict[int, dict[str, float]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(rows)
    fig, ax = plt.subplots(figsize=(7, 5))
    for op in OPS:
        xs = [n for n in sizes if op in rows[n]]
        ax.plot(xs, [rows[n][op] for n in xs], marker="o", label=op)
    if sizes:
        lo, hi = sizes[0], sizes[-1]
        base = rows[lo].get("pdsh")
        if base:
            ax.plot([lo, hi], [base, base * hi / lo], "k:", label="linear (from pdsh)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("seconds (whole process)")
    ax.set_title("clustertool's own cost vs cluster size (local nodes, one 2-core machine)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,32,128,254")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of exec cold/warm and pdsh")
    ap.add_argument("--png", default=str(REPO / "results" / "scale" / "scale.png"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (local provider)", file=sys.stderr)
        return 2
    if not shutil.which("pdsh"):
        print("pdsh not found: apt-get install pdsh", file=sys.stderr)
        return 2
    home = Home("ct-bench-scale-")
    rows: dict[int, dict[str, float]] = {}
    try:
        for n in parse_list(args.sizes):
            rows[n] = one_size(home, n, args.rounds, lambda text: print(text, flush=True))
    finally:
        home.remove()
        print("\n" + table(rows))
        if rows:
            chart(rows, Path(args.png))
            print(f"chart: {args.png}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
