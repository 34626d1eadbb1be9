"""The CPU the job recorder costs: one training job on a local cluster, the CPU seconds of the recorder's processes
(the watch hub on the leader, a sampler per node, the ssh between them) against the job's own, read from this
machine's /proc every 0.2 s while the job runs (a local cluster's processes live in its namespaces here).

    sudo .venv/bin/python bench/watch_record_cpu.py -c NAME --nodes 4 --runs 2

Needs a local cluster NAME (`clustertool up --provider local --nodes 4 --name NAME`) and numpy on the nodes (the
train extra).  Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clustertool.providers.local import net, sysops  # noqa: E402
from clustertool.workloads import node_python  # noqa: E402

CLI = [sys.executable, "-m", "clustertool"]
WATCH = ("ct-watch", "ct-watchnode")


def processes(name: str, nodes: int) -> dict[int, tuple[str, int, float]]:
    """pid -> (comm, ppid, cpu seconds) of every process in the cluster's namespaces."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for pids in sysops.pids_in_netns([net.netns_name(name, i) for i in range(1, nodes + 1)]).values():
        for pid in pids:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[pid] = (comm, int(f[1]), (int(f[11]) + int(f[12])) / tick)
    return out


def running(name: str, job: str) -> bool:
    jobs = json.loads(subprocess.run(CLI + ["jobs", "-c", name, "--json"], capture_output=True, text=True).stdout)
    return next(j for j in jobs["jobs"] if j["id"] == job)["state"] == "running"


def one(name: str, nodes: int, steps: int) -> dict:
    mlp = REPO / "clustertool" / "workloads" / "train_mlp.py"
    cmd = CLI + ["run", "-c", name, "--json", "--", *node_python(), str(mlp), "--steps", str(steps), "--batch", "256",
                 "--hidden", "256"]
    t0 = time.monotonic()
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["id"]
    watch_cpu: dict[int, float] = {}
    job_cpu: dict[int, float] = {}
    asked = 0.0
    while True:
        info = processes(name, nodes)
        watch = {p for p, (comm, _, _) in info.items() if comm in WATCH}
        carriers = {info[p][1] for p in watch if info[p][0] == "ct-watchnode"}   # sh / sshd under a sampler
        clients = {p for p, (_, ppid, _) in info.items() if ppid in watch}       # the hub's ssh clients
        for pid in (watch | carriers | clients) & set(info):
            watch_cpu[pid] = max(watch_cpu.get(pid, 0.0), info[pid][2])
        for pid, (comm, _, cpu) in info.items():
            if comm.startswith("python"):
                job_cpu[pid] = max(job_cpu.get(pid, 0.0), cpu)
        if time.monotonic() - asked > 2:
            asked = time.monotonic()
            if not running(name, job):
                break
        time.sleep(0.2)
    rec, own = sum(watch_cpu.values()), sum(job_cpu.values())
    return {"job": job, "wall_s": round(time.monotonic() - t0, 1), "recorder_cpu_s": round(rec, 2),
            "recorder_processes": len(watch_cpu), "job_cpu_s": round(own, 1),
            "recorder_share_of_job_cpu": round(rec / own, 4) if own else None,
            "recorder_share_of_one_core": round(rec / (time.monotonic() - t0), 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--cluster", required=True)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(one(args.cluster, args.nodes, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
