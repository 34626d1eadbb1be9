#!/usr/bin/env python3
"""Issue 31's CPU benchmarks on one host with no MPI library and no ip/tc (a GPU host):
collnet_bench_lite (make lite) started by minirun.py, over loopback.

    python3 native/bench/lite_bench.py --out /tmp/lite            # both parts, medians of 3
    python3 native/bench/lite_bench.py --parts stream --repeat 5

stream:  4 ranks, unpaced, 16M and 64M, sharded and ring: the request stream NCCL's proxy
         sends (-r 256K -q 8, -r 64K -q 8, -r 256K -q 1) against one request per allreduce.
servers: CLUSTERTOOL_LINK_RATE (default 1gbit) on every rank and reducer (one token bucket
         per process and direction: a NIC per process), 64M, servers/sharded/ring in the
         stream form, 4 workers + 4 reducers and 8 + 8; busbw as a multiple of the rate B.

Writes lite.md (the tables with their commands) and lite.json under --out, and prints
lite.md. Every row must have #wrong 0, or the run fails. Stops each part at --budget."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minirun import stop  # this folder is the script's: on sys.path

HERE = Path(__file__).resolve().parent
MODES = [("one request", []), ("-r 256K -q 8", ["-r", "256K", "-q", "8"]),
         ("-r 64K -q 8", ["-r", "64K", "-q", "8"]), ("-r 256K -q 1", ["-r", "256K", "-q", "1"])]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, default=HERE.parent / "build")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--parts", default="stream,servers")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rate", default="1gbit", help="CLUSTERTOOL_LINK_RATE for the servers part")
    p.add_argument("--budget", type=float, default=300, help="seconds for all parts together")
    return p.parse_args(argv)


def rate_bytes(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f / 8
    raise ValueError(f"bad rate {rate!r}")


def rows(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 9 and f[0].isdigit():
            out.append({"bytes": int(f[0]), "algo": f[4], "busbw": float(f[7]), "wrong": int(f[8])})
    return out


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat (None where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(v) - v[3] - v[4], sum(v)


def busy_since(t0: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time that was busy since t0 (idle and iowait are not)."""
    t1 = cpu_ticks()
    if not t0 or not t1 or t1[1] == t0[1]:
        return None
    return round((t1[0] - t0[0]) / (t1[1] - t0[1]), 3)


def run_bench(build: Path, np_: int, args: list[str], env: dict, timeout: float) -> list[dict]:
    argv = [sys.executable, str(HERE / "minirun.py"), "--timeout", str(max(5, int(timeout))), "-np", str(np_),
            str(build / "collnet_bench_lite"), "-p", str(build / "libnccl-net-clustertool.so"), *args]
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    text = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {r.returncode}:\n{text[-2000:]}")
    got = rows(r.stdout)
    bad = [x for x in got if x["wrong"] != 0]
    if not got or bad:
        raise RuntimeError(f"rows with #wrong != 0 (or none): {bad or text[-2000:]}")
    return got


def stats_of(path: Path) -> dict:
    docs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    if not docs:
        return {}
    return {"inflight_mean": round(statistics.mean(d["inflight_mean"] for d in docs), 2),
            "inflight_max": max(d["inflight_max"] for d in docs), "threads": docs[0]["threads"],
            "mean_bytes": round(statistics.mean(d["mean_bytes"] for d in docs))}


def stream_part(a, env: dict, ends: float, work: Path) -> dict:
    res: dict = {"busbw": {}, "stats": {}, "busy": {}}
    for rep in range(a.repeat):
        for m, (name, extra) in enumerate(MODES):
            left = ends - time.monotonic()
            if left < 10:
                res["stopped"] = f"budget: repeat {rep + 1}, {name}"
                return res
            st = work / f"stats-{m}-{rep}.jsonl"
            e = dict(env, CLUSTERTOOL_COLLNET_STATS=str(st))
            t0 = cpu_ticks()
            got = run_bench(a.build, 4, ["-b", "16M", "-e", "64M", "-f", "4", "-n", "10", "-w", "2",
                                            "-a", "sharded,ring", *extra], e, left)
            res["busy"].setdefault(name, []).append(busy_since(t0))
            for x in got:
                res["busbw"].setdefault(f"{name}|{x['algo']}|{x['bytes']}", []).append(x["busbw"])
            res["stats"].setdefault(name, stats_of(st))
    return res


def start_reducers(build: Path, k: int, env: dict, work: Path) -> tuple[list[subprocess.Popen], str]:
    procs, files = [], []
    for i in range(k):
        f = work / f"r{i}.port"
        files.append(f)
        argv = [str(build / "clustertool-reducer"), "--bind", "127.0.0.1", "--port-file", str(f)]
        with open(work / f"r{i}.log", "w") as log:
            procs.append(subprocess.Popen(argv, env=env, stderr=log))
    t = time.monotonic() + 10
    while not all(f.exists() and f.read_text().endswith("\n") for f in files):
        if time.monotonic() > t or any(p.poll() is not None for p in procs):
            stop(procs)
            raise RuntimeError("the reducers did not start")
        time.sleep(0.05)
    return procs, ",".join(f.read_text().strip() for f in files)


def servers_part(a, env: dict, ends: float, work: Path) -> dict:
    res: dict = {"rate": a.rate, "busbw_over_B": {}}
    b_gbs = rate_bytes(a.rate) / 1e9
    paced = dict(env, CLUSTERTOOL_LINK_RATE=a.rate)
    for n in (4, 8):
        for rep in range(a.repeat):
            left = ends - time.monotonic()
            if left < 20:
                res["stopped"] = f"budget: {n}+{n}, repeat {rep + 1}"
                return res
            procs, addrs = start_reducers(a.build, n, paced, work)
            try:
                got = run_bench(a.build, n, ["-b", "64M", "-e", "64M", "-n", "3", "-w", "1",
                                                "-a", "servers,sharded,ring", "-r", "256K", "-q", "8"],
                                   dict(paced, CLUSTERTOOL_REDUCERS=addrs), left)
            finally:
                stop(procs)
            for x in got:
                res["busbw_over_B"].setdefault(f"{n}+{n}|{x['algo']}", []).append(round(x["busbw"] / b_gbs, 3))
    return res


def med(v: list[float]) -> float:
    return statistics.median(v)


def report(a, doc: dict) -> str:
    lines = [f"# collnet_bench_lite on {os.cpu_count()} cores, loopback, medians of {a.repeat}", ""]
    s = doc.get("stream")
    if s:
        lines += ["## The request stream against one request per allreduce (4 ranks, unpaced)", "",
                  "`python3 native/bench/minirun.py -np 4 native/build/collnet_bench_lite "
                  "-b 16M -e 64M -f 4 -n 10 -w 2 -a sharded,ring [MODE]`", "",
                  "| algo | size | " + " | ".join(m for m, _ in MODES) + " | " +
                  " | ".join(f"{m} / one" for m, _ in MODES[1:]) + " |",
                  "|" + " --- |" * (2 + 2 * len(MODES) - 1)]
        for algo in ("sharded", "ring"):
            for size in (16 << 20, 64 << 20):
                vals = [s["busbw"].get(f"{m}|{algo}|{size}") for m, _ in MODES]
                meds = [med(v) if v else None for v in vals]
                cells = [f"{x:.3f}" if x is not None else "-" for x in meds]
                ratios = [f"{x / meds[0]:.2f}x" if x is not None and meds[0] else "-" for x in meds[1:]]
                lines.append(f"| {algo} | {size >> 20}M | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        q8 = [s["busbw"].get(f"-r 256K -q 8|{al}|{sz}") for al in ("sharded", "ring") for sz in (16 << 20, 64 << 20)]
        q1 = [s["busbw"].get(f"-r 256K -q 1|{al}|{sz}") for al in ("sharded", "ring") for sz in (16 << 20, 64 << 20)]
        busy = {m: [x for x in v if x is not None] for m, v in s["busy"].items()}
        lines += ["", "CPU busy while each form ran (all cores, /proc/stat; near 100 %: CPU-bound, the forms then "
                  "compare CPU per byte, not overlap): " +
                  ", ".join(f"{m} {100 * med(v):.0f} %" for m, v in busy.items() if v)]
        lines += ["", "busbw in GB/s. -q 8 over -q 1 (256K): " +
                  ", ".join(f"{med(x) / med(y):.2f}x" for x, y in zip(q8, q1) if x and y), "",
                  "CollNet stats per mode (first run): " +
                  "; ".join(f"{m}: {json.dumps(st)}" for m, st in s["stats"].items()), ""]
        if s.get("stopped"):
            lines.append(f"Stopped early ({s['stopped']}).")
    v = doc.get("servers")
    if v:
        lines += [f"## Reduction servers, every process paced at {v['rate']} (B), 64M, -r 256K -q 8", "",
                  "`CLUSTERTOOL_LINK_RATE=%s`, N `clustertool-reducer --bind 127.0.0.1`, "
                  "`minirun.py -np N collnet_bench_lite -b 64M -e 64M -n 3 -w 1 -a servers,sharded,ring -r 256K -q 8`"
                  % v["rate"], "", "| workers + servers | servers | sharded | ring |", "| --- | --- | --- | --- |"]
        for n in (4, 8):
            cells = [v["busbw_over_B"].get(f"{n}+{n}|{al}") for al in ("servers", "sharded", "ring")]
            if any(cells):
                lines.append(f"| {n} + {n} | " + " | ".join(f"{med(c):.3f}·B" if c else "-" for c in cells) + " |")
        if v.get("stopped"):
            lines.append(f"\nStopped early ({v['stopped']}).")
    if doc.get("errors"):
        lines += ["", "Errors:", *[f"- {e}" for e in doc["errors"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    ends = time.monotonic() + a.budget
    env = dict(os.environ, CLUSTERTOOL_SOCKET_IFNAME="lo")
    doc: dict = {"cores": os.cpu_count(), "repeat": a.repeat, "errors": []}
    parts = a.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="lite-bench-") as tmp:
        work = Path(tmp)
        for part, fn, share in (("stream", stream_part, 0.45), ("servers", servers_part, 1.0)):
            if part not in parts:
                continue
            part_ends = min(ends, time.monotonic() + share * (ends - time.monotonic())) if len(parts) > 1 else ends
            try:
                doc[part] = fn(a, env, part_ends, work)
            except Exception as e:  # one part failing still reports the other
                doc["errors"].append(f"{part}: {e}")
    text = report(a, doc)
    (a.out / "lite.md").write_text(text)
    (a.out / "lite.json").write_text(json.dumps(doc, indent=1))
    print(text)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
