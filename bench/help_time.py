#!/usr/bin/env python3
"""Benchmark: how long `clustertool --help` takes, as a whole process and inside it.

`clustertool --help` must stay fast (no heavy imports at module level in cli/).  The test
(tests/cli/test_completion_and_usage.py) asserts what --help imports, not how long it takes, since a
loaded machine slows any process; the figure is here.  Prints the median and best of N runs of the
whole process (interpreter start included) and of the in-process part (import and render), beside
`python -c pass`, the floor any command pays; about 0.2 s in-process on an idle machine.

    .venv/bin/python bench/help_time.py [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSIDE = ("import sys, time\nt = time.perf_counter()\nfrom clustertool.cli.app import run\n"
          "try:\n    run(['--help'])\nexcept SystemExit:\n    pass\n"
          "sys.stderr.write(f'{time.perf_counter() - t:.4f}')")


def one(code: str) -> tuple[float, float | None]:
    """(wall seconds of the process, seconds it measured inside itself or None)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed: {proc.stderr[-1000:]}")
    inside = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return wall, float(inside) if inside else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    floor, help_wall, help_inside = [], [], []
    for _ in range(args.runs):  # alternate, so a change in the machine's load hits both alike
        floor.append(one("pass")[0])
        wall, inside = one(INSIDE)
        help_wall.append(wall)
        help_inside.append(inside or 0.0)
    rows = {"python -c pass (s)": floor, "clustertool --help, whole process (s)": help_wall,
            "clustertool --help, import and render (s)": help_inside}
    figures = {k: {"median": round(statistics.median(v), 3), "best": round(min(v), 3)} for k, v in rows.items()}
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    if args.json:
        print(json.dumps({"runs": args.runs, "load": float(load), "figures": figures}, indent=1))
        return
    print(f"{args.runs} runs each, load average {load} (a loaded machine slows every row alike)")
    for name, fig in figures.items():
        print(f"  {name:44s} median {fig['median']:.3f}  best {fig['best']:.3f}")
    ratio = statistics.median(help_wall) / statistics.median(floor)
    print(f"  --help against a bare interpreter: {ratio:.1f}x")


if __name__ == "__main__":
    main()
