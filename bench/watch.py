"""The cost of watching a cluster, and how fast `top` refreshes, on a local cluster of N nodes.

    sudo .venv/bin/python bench/watch.py --nodes 32 [--window 30] [--json out.json] [--skip-monitoring]

Brings up its own local cluster (its own CLUSTERTOOL_HOME; down at the end), then measures:

* ``top --once --json``: wall time from the command's start to the reading printed (3 readings, 0.5 s apart,
  after a first one for the rates), several times;
* live ``top`` (the hub in stream mode, 1 s readings): per reading, the time from asking every node to having
  the whole view (``reading_s``, the hub's own clock), and how many nodes had answered;
* CPU, measured with the nodes' own CPU time: every process of each node's namespaces (utime + stime from
  /proc), over ``--window`` seconds idle, then over the same length with top running, then with
  ``monitoring enable`` (scrape every 15 s) running.  The cost is the difference to idle, as % of one core,
  per member node (median and max) and on the leader.

Local nodes share this machine's cores with everything else here: figures are noisy while the machine is
busy (the load average is printed with them).
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
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clustertool.providers.local import net, sysops  # noqa: E402

CLI = [sys.executable, "-m", "clustertool"]
TICK = os.sysconf("SC_CLK_TCK")


def cli(env: dict, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def cpu_by_node(name: str, count: int) -> dict[str, float]:
    """CPU seconds so far of every process in each node's namespace."""
    spaces = [net.netns_name(name, i) for i in range(1, count + 1)]
    out = {}
    for ns, pids in sysops.pids_in_netns(spaces).items():
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        out[f"node-{int(ns.rsplit('-', 1)[1])}"] = total / TICK
    return out


def window(name: str, count: int, seconds: float) -> dict[str, float]:
    before, t0 = cpu_by_node(name, count), time.monotonic()
    time.sleep(seconds)
    after, dt = cpu_by_node(name, count), time.monotonic() - t0
    return {n: 100.0 * (after.get(n, 0.0) - before.get(n, 0.0)) / dt for n in before}


def cost(idle: dict[str, float], busy: dict[str, float]) -> dict[str, float]:
    extra = {n: busy[n] - idle.get(n, 0.0) for n in busy}
    members = [v for n, v in extra.items() if n != "node-1"]
    return {"leader_pct": round(extra.get("node-1", 0.0), 2), "member_median_pct": round(statistics.median(members), 2),
            "member_max_pct": round(max(members), 2)}


def once_latency(env: dict, name: str, runs: int) -> dict[str, list]:
    took, connected = [], []
    for _ in range(runs):
        t0 = time.monotonic()
        proc = cli(env, "top", "-c", name, "--once", "--json", timeout=300)
        took.append(round(time.monotonic() - t0, 2))
        view = json.loads(proc.stdout)
        assert all(n["state"] == "ok" for n in view["nodes"]), [n for n in view["nodes"] if n["state"] != "ok"]
        connected.append(view["connected_s"])
    return {"wall_s": took, "hub_connected_s": connected}


def live(env: dict, name: str, count: int, seconds: float) -> dict:
    """Live top for ``seconds`` (after 5 s to settle): the readings' latency and the CPU of the nodes meanwhile.

    What `top` runs on the cluster, started through the API (top's own stream, without drawing it here)."""
    from clustertool.cluster.session import ClusterSession
    from clustertool.watch.hub import WatchRequest, stream

    os.environ.update({k: env[k] for k in ("CLUSTERTOOL_HOME", "CLUSTERTOOL_HOSTFILE_DIR")})
    readings: list[dict] = []
    stop = threading.Event()

    def read() -> None:
        with stream(ClusterSession.load(name), WatchRequest(interval=1.0)) as hub:
            for view in hub.views():
                readings.append({"reading_s": view["reading_s"], "answered": view["answered"]})
                if stop.is_set():
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(5)
    busy = window(name, count, seconds)
    stop.set()
    reader.join(30)
    steady = readings[3:] or readings
    lat = sorted(r["reading_s"] for r in steady)
    return {"cpu": busy, "readings": len(steady), "reading_s_median": lat[len(lat) // 2] if lat else None,
            "reading_s_p90": lat[int(0.9 * (len(lat) - 1))] if lat else None,
            "all_answered": sum(1 for r in steady if r["answered"] == count)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--once-runs", type=int, default=5)
    p.add_argument("--skip-monitoring", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-watch-"))
    env = dict(os.environ, CLUSTERTOOL_HOME=str(tmp / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp / "hf"),
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    name = f"bw{os.getpid() % 10000}"
    result: dict = {"nodes": a.nodes, "window_s": a.window, "load_before": os.getloadavg()}
    t0 = time.monotonic()
    up = cli(env, "up", "--provider", "local", "--nodes", str(a.nodes), "--name", name)
    result["up_s"] = round(time.monotonic() - t0, 1)
    try:
        if up.returncode != 0:
            result["error"] = up.stderr[-2000:]
            return report(result, a.json, 1)
        time.sleep(5)
        idle = window(name, a.nodes, a.window)
        result["once"] = once_latency(env, name, a.once_runs)
        lv = live(env, name, a.nodes, a.window)
        result["top"] = dict({k: v for k, v in lv.items() if k != "cpu"}, **cost(idle, lv["cpu"]))
        if not a.skip_monitoring:
            en = cli(env, "monitoring", "enable", "-c", name, timeout=600)
            result["monitoring_enable_rc"] = en.returncode
            time.sleep(20)  # Prometheus's start, a first scrape of everything
            result["monitoring"] = cost(idle, window(name, a.nodes, max(a.window, 60.0)))
        result["load_after"] = os.getloadavg()
    finally:
        cli(env, "down", "-c", name, "--yes")
        shutil.rmtree(tmp, ignore_errors=True)
    return report(result, a.json, 0)


def report(result: dict, path: str | None, code: int) -> int:
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
