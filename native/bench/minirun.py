#!/usr/bin/env python3
"""Starts N ranks of a program built against bench/mini_mpi.c (make lite) on this host:
the MPI-less way to run collnet_bench where no MPI library is installed (a GPU host).

    python3 bench/minirun.py -np 4 build/collnet_bench_lite -b 16M -e 64M -a sharded,ring

Every rank inherits stdout and stderr (rank 0 prints the table). If a rank fails, the
others are stopped, and the exit status is the first failure's. A folder in $TMPDIR holds
the shared files for the run and is removed at the end. -x NAME=VALUE sets a variable
for one rank only, as RANK:NAME=VALUE (e.g. -x 0:CLUSTERTOOL_COLLNET_STATS=1)."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, required=True, help="ranks to start")
    p.add_argument("--timeout", type=float, default=0, help="stop every rank after this many seconds (0: never)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    a = p.parse_args(argv)
    if a.np < 1 or not a.program:
        p.error("give -np N (1 or more) and a program")
    if a.program[0] == "--":
        a.program = a.program[1:]
    return a


def rank_env(rank: int, size: int, folder: str) -> dict[str, str]:
    return dict(os.environ, CT_MINI_MPI_DIR=folder, CT_MINI_MPI_RANK=str(rank), CT_MINI_MPI_SIZE=str(size))


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process still running, then SIGKILL to any that has not ended within 5 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    folder = tempfile.mkdtemp(prefix="minirun-")
    procs: list[subprocess.Popen] = []
    try:
        with open(os.path.join(folder, "ctl"), "wb") as f:
            f.write(b"\0" * 4096)
        open(os.path.join(folder, "data"), "wb").close()
        for r in range(a.np):
            procs.append(subprocess.Popen(a.program, env=rank_env(r, a.np, folder)))
        ends = time.monotonic() + a.timeout if a.timeout > 0 else None
        code = 0
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or (ends and time.monotonic() > ends):
                code = failed[0] if failed else 124
                if not failed:
                    print(f"minirun: stopped after {a.timeout:g} s", file=sys.stderr)
                break
            time.sleep(0.05)
        stop(procs)
        if not code:
            code = next((p.returncode for p in procs if p.returncode), 0)
        return code if code >= 0 else 128 - code
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
