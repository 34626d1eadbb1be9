#!/usr/bin/env python3
"""Benchmark: from `clustertool run` to every rank's first line, and how fast a failed job is gone.

Brings up local clusters (real sshd nodes in namespaces) of 8 and 32 nodes x 2 slots, then, one
launcher at a time, in rounds alternating with that launcher's by-hand form, starts a tiny rank program
(it prints its RANK and the time, then sleeps a little) with:

  clustertool run                          the default launcher (mpirun)
  clustertool run -- torchrun ...          one torchrun per node, started by the leader's fan-out
  clustertool run --launcher process       one process per slot, started by clustertool's agent
  clustertool run -- accelerate launch ... one `accelerate launch` per node
  clustertool run -- deepspeed ...         one DeepSpeed runner per node (its --no_ssh form)
  clustertool run -x CLUSTERTOOL_WARM=0 -- torchrun ...
                                           torchrun cold: every node's torchrun imports torch itself, as on a
                                           cluster's first torchrun job (after it, each node keeps a warm
                                           launcher that the next start forks: nodeprogs/warmlaunch.py)

and what a user types by hand, each through pdsh -w <every node> (this machine's ssh config, its
ControlMaster connections to the nodes kept from `up`), the node rank from the host name:

  pdsh torchrun      torchrun --nnodes N --nproc-per-node 2 --node-rank K --master-addr <leader>
                     --master-port <port> first.py
  pdsh accelerate    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_machines N --machine_rank K
                     --main_process_ip <leader> --main_process_port <port> --num_processes 2N first.py
                     (ACCELERATE_USE_CPU=1: what clustertool's agent sets on nodes without a GPU)
  pdsh deepspeed     deepspeed --hostfile <file> --no_ssh --num_nodes N --node_rank K --master_addr
                     <leader> --master_port <port> --num_gpus 2 first.py

Each launcher's untimed round goes first (it and its by-hand form once: the page cache, and the warm
launchers made and waited for, as on a cluster that has run that launcher once; they are ended before the
next launcher's turn: three kinds on 32 local nodes would not fit this machine's memory).  The start time
is the moment the command starts; a run's figure is the last rank's timestamp minus it (the nodes share
this machine's clock).  Ratios are to the by-hand form timed beside the launcher (mpirun, process and
torchrun cold: pdsh torchrun), medians of the rounds.

Fail fast (--fail, at 32 nodes and more): a job where rank 1 exits 1 at once and every other rank
sleeps: the time from that rank's exit to the last process of the job gone from every node (read from
/proc in every node's namespace), for each launcher.

    sudo .venv/bin/python bench/launch.py [--nodes 8,32] [--rounds 3] [--launchers ...] [--fail ...] [--json out.json]

--slurm: the Slurm path instead (issue 34).  Two local clusters of each size side by side, one plain and one
made by `up --scheduler slurm`; in alternating rounds the same mpirun job (`run --follow`) starts on each:
through sbatch (the job queued, its batch script on the allocation's first node, mpirun inside the
allocation with its daemons started by srun) and through clustertool's own path (mpirun on the leader over
ssh).  Ratio: Slurm's median to the mpirun path's.  Then the queue: --queue jobs of one node each (2
ranks, `true`) submitted at once through the Python API to the first Slurm cluster, drained end to end:
seconds per job from the first submission to the last job's end, and the submissions alone.

    sudo .venv/bin/python bench/launch.py --slurm [--nodes 8,32] [--rounds 3] [--queue 50]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))   # at the end: bench/copy.py must not shadow copy
from benchlib import CLI as CT  # noqa: E402
from benchlib import Home  # noqa: E402

SLOTS = 2

FIRST = r'''
import os, sys, time
# one write: under pdsh two ranks share a pipe, and `python -u` prints each piece of a print() apart
sys.stdout.write(f"first {os.environ.get('RANK')} {time.time()!r}\n")
sys.stdout.flush()
if "fail" in sys.argv[1:]:   # DeepSpeed puts --local_rank=N first
    if os.environ.get("RANK") == "1":
        sys.exit(1)
    time.sleep(600)
time.sleep(2)
'''


def sh(argv, env, check=True, **kw):
    return subprocess.run(argv, env=env, check=check, capture_output=True, text=True, **kw)


def node_bin(program: str) -> str:
    """A launcher's script of this environment (its #! line names this environment's python)."""
    return str(Path(sys.executable).parent / program)


def node_python() -> list[str]:
    from clustertool import workloads

    return workloads.node_python()


LAUNCHERS = ("mpirun", "torchrun", "process", "accelerate", "deepspeed", "torchrun cold")
BY_HAND = {"torchrun": "pdsh torchrun", "accelerate": "pdsh accelerate", "deepspeed": "pdsh deepspeed",
           "mpirun": "pdsh torchrun", "process": "pdsh torchrun", "torchrun cold": "pdsh torchrun"}
# The node launchers whose next start on a node is forked from a warm launcher (nodeprogs/warmlaunch.py)
WARM = ("torchrun", "accelerate", "deepspeed")


def command(launcher: str, script: str) -> list[str]:
    """What follows `clustertool run`: torchrun, accelerate and deepspeed as users write them (detected),
    the others by flag.  ``torchrun cold``: torchrun with no warm launcher (a cluster's first torchrun job)."""
    if launcher == "torchrun cold":
        return ["-x", "CLUSTERTOOL_WARM=0", "--", node_bin("torchrun"), script]
    if launcher == "torchrun":
        return ["--", node_bin("torchrun"), script]
    if launcher == "accelerate":
        return ["--", node_bin("accelerate"), "launch", script]
    if launcher == "deepspeed":
        return ["--", node_bin("deepspeed"), script]
    return ["--launcher", launcher, "--", *node_python(), script]


def by_hand(kind: str, nodes: int, leader_addr: str, port: int, script: str, hostfile: str) -> str:
    """The remote line a user types for ``kind`` (node rank K from the host name, node-K: K-1)."""
    rank = "$(( $(hostname | sed 's/^node-//') - 1 ))"
    if kind == "pdsh torchrun":
        # static rendezvous: the same as clustertool's torchrun launcher, so the rows compare the starting
        return (f"{node_bin('torchrun')} --nnodes {nodes} --nproc-per-node {SLOTS} --node-rank {rank} "
                f"--master-addr {leader_addr} --master-port {port} {script}")
    if kind == "pdsh accelerate":
        return (f"ACCELERATE_USE_CPU=1 {node_bin('accelerate')} launch --multi_gpu --num_machines {nodes} "
                f"--machine_rank {rank} --main_process_ip {leader_addr} --main_process_port {port} "
                f"--num_processes {nodes * SLOTS} {script}")
    return (f"{node_bin('deepspeed')} --hostfile {hostfile} --no_ssh --num_nodes {nodes} --node_rank {rank} "
            f"--master_addr {leader_addr} --master_port {port} --num_gpus {SLOTS} {script}")


def firsts(text: str) -> dict[int, float]:
    return {int(r): float(t) for r, t in re.findall(r"first (\d+) ([0-9.]+)", text)}


def ct_start(name, env, launcher, script, nranks) -> float:
    """Seconds from `clustertool run` to the last rank's first line."""
    argv = CT + ["run", "-c", name, "--follow", "--no-tag-output", *command(launcher, script)]
    t0 = time.time()
    proc = sh(argv, env, check=False, timeout=900)
    seen = firsts(proc.stdout)
    if proc.returncode != 0 or len(seen) != nranks:
        found = re.search(r"job (j[0-9a-f-]+) started", proc.stderr)
        log = sh(CT + ["logs", "-c", name, found.group(1)], env, check=False).stdout[-3000:] if found else ""
        raise SystemExit(f"{launcher}: {proc.returncode}, {len(seen)} of {nranks} ranks: {proc.stderr[-800:]}\n"
                         f"the job's log ends:\n{log}")
    return max(seen.values()) - t0


def pdsh_start(kind, name, home, env, nodes, leader_addr, script, nranks, port, hostfile) -> float:
    cfg = f"{home}/clusters/{name}/ssh_config"
    aliases = [f"{name}-node-{i}" for i in range(1, nodes + 1)]
    remote = by_hand(kind, nodes, leader_addr, port, script, hostfile)
    penv = dict(env, PDSH_SSH_ARGS=f"-F {cfg} -l%u %h")
    t0 = time.time()
    proc = sh(["pdsh", "-R", "ssh", "-f", str(nodes), "-w", ",".join(aliases), remote], penv, check=False, timeout=900)
    seen = firsts(proc.stdout)
    if len(seen) != nranks:
        raise SystemExit(f"{kind}: {proc.returncode}, {len(seen)} of {nranks} ranks: {proc.stderr[-800:]}")
    return max(seen.values()) - t0


def wait_warm(home: str, name: str, nodes: int, count: int, timeout: float = 600.0) -> float:
    """Wait until every node has ``count`` warm launchers ready (their sockets, in the local nodes' homes);
    the seconds it took."""
    t0 = time.monotonic()
    folders = [Path(home) / "clusters" / name / "local" / f"node-{i}" / "home" / ".clustertool" / "warm"
               for i in range(1, nodes + 1)]
    while time.monotonic() - t0 < timeout:
        if all(len(list(f.glob("*.sock"))) >= count for f in folders):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"the warm launchers were not ready on every node within {timeout:.0f} s")


def drop_warm(home: str, name: str, nodes: int, timeout: float = 60.0) -> None:
    """Every node's warm launchers ended (their sockets removed: each ends within 5 s)."""
    for i in range(1, nodes + 1):
        for sock in (Path(home) / "clusters" / name / "local" / f"node-{i}" / "home" / ".clustertool" / "warm"
                     ).glob("*.sock"):
            sock.unlink()
    deadline = time.monotonic() + timeout
    while warm_pids() and time.monotonic() < deadline:
        time.sleep(0.5)


def warm_pids() -> list[str]:
    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if b"\0CLUSTERTOOL_WARM_KEY=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def job_pids(name: str, job_id: str) -> int:
    marker = f"CLUSTERTOOL_JOB={job_id}".encode()
    count = 0
    for ns in [line.split()[0] for line in sh(["ip", "netns", "list"], None).stdout.splitlines()
               if line.startswith(f"ct-{name}-")]:
        for pid in sh(["ip", "netns", "pids", ns], None, check=False).stdout.split():
            try:
                if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    count += 1
            except OSError:
                pass
    return count


def fail_fast(name, env, launcher, script) -> float:
    """Seconds from rank 1's exit to the job's last process gone everywhere."""
    argv = CT + ["run", "-c", name, "--no-tag-output", *command(launcher, script), "fail"]
    job_id = sh(argv, env).stdout.strip()
    deadline = time.monotonic() + 300
    t_exit = None
    while time.monotonic() < deadline:
        if t_exit is None:
            out = sh(CT + ["logs", "-c", name, job_id], env, check=False).stdout
            t_exit = firsts(out).get(1)
        elif job_pids(name, job_id) == 0:
            return time.time() - t_exit
        time.sleep(0.1)
    raise SystemExit(f"{launcher}: job {job_id} still has processes after 300 s")


def bench_size(nodes: int, rounds: int, home: str, env: dict, launchers: list[str], fail: list[str]) -> dict:
    name = f"bl{nodes}"
    sh(CT + ["up", "--provider", "local", "--nodes", str(nodes), "--slots", str(SLOTS), "--name", name], env)
    folder = Path(tempfile.mkdtemp(prefix="ct-bench-launch-", dir="/var/tmp"))  # every local node sees /var/tmp
    script = str(folder / "first.py")
    Path(script).write_text(FIRST)
    try:
        status = json.loads(sh(CT + ["status", "-c", name, "--json"], env).stdout)
        leader = next(n["address"] for n in status["nodes"] if n["role"] == "leader")
        hostfile = folder / "ds_hostfile"  # the by-hand DeepSpeed's: every node, leader first
        hostfile.write_text("".join(f"{n['address']} slots={SLOTS}\n" for n in status["nodes"]))
        nranks = nodes * SLOTS
        times: dict[str, list[float]] = {}
        hand_times: dict[str, list[float]] = {}
        warm_s: dict[str, float] = {}
        fails = {}
        port = 29400
        # one launcher at a time, each beside its by-hand form (every node's warm launchers of all three kinds at
        # once would be 3 x 170 MB a node: past this machine's memory at 32 local nodes)
        for launcher in launchers:
            kind = BY_HAND[launcher]
            # one round nobody times: the files in the page cache, and the node launcher's warm launchers made
            # and ready, as on a cluster that has run that launcher once (the `torchrun cold` row is the first)
            ct_start(name, env, launcher, script, nranks)
            port += 1
            pdsh_start(kind, name, home, env, nodes, leader, script, nranks, port, str(hostfile))
            if launcher in WARM:
                warm_s[launcher] = wait_warm(home, name, nodes, 1)
            times[launcher], hand_times[launcher] = [], []
            for _ in range(rounds):
                times[launcher].append(ct_start(name, env, launcher, script, nranks))
                port += 1
                hand_times[launcher].append(pdsh_start(kind, name, home, env, nodes, leader, script, nranks, port,
                                                       str(hostfile)))
            if nodes >= 32 and launcher in fail:
                fails[launcher] = fail_fast(name, env, launcher, script)
            drop_warm(home, name, nodes)
        return {"start": times, "by_hand": hand_times, "fail_fast": fails, "load": os.getloadavg(),
                "warm_ready_s": warm_s}
    finally:
        sh(CT + ["down", "-c", name, "--yes"], env, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def slurm_size(nodes: int, rounds: int, env: dict) -> dict:
    """Job start through sbatch vs the mpirun path, on two clusters of ``nodes`` side by side."""
    names = {"slurm": f"bs{nodes}", "mpirun": f"bm{nodes}"}
    sh(CT + ["up", "--provider", "local", "--nodes", str(nodes), "--slots", str(SLOTS), "--name", names["mpirun"]],
       env)
    sh(CT + ["up", "--provider", "local", "--nodes", str(nodes), "--slots", str(SLOTS), "--name", names["slurm"],
             "--scheduler", "slurm"], env)
    folder = Path(tempfile.mkdtemp(prefix="ct-bench-launch-", dir="/var/tmp"))
    script = str(folder / "first.py")
    Path(script).write_text(FIRST)
    try:
        times: dict[str, list[float]] = {"sbatch (mpirun in the allocation)": [], "mpirun path": []}
        for _ in range(rounds):
            times["sbatch (mpirun in the allocation)"].append(ct_start(names["slurm"], env, "mpirun", script,
                                                                       nodes * SLOTS))
            times["mpirun path"].append(ct_start(names["mpirun"], env, "mpirun", script, nodes * SLOTS))
        return {"start": times}
    finally:
        for name in names.values():
            sh(CT + ["down", "-c", name, "--yes"], env, check=False)
        shutil.rmtree(folder, ignore_errors=True)


QUEUE_JOB = "from clustertool import Cluster\nimport json, sys, time\n" \
    "c = Cluster.load(sys.argv[1])\nt0 = time.time()\n" \
    "ids = [c.run(['true'], launcher='process', np=2).id for _ in range(int(sys.argv[2]))]\n" \
    "t1 = time.time()\n" \
    "while any(j.state in ('pending', 'running') for j in c.jobs() if j.id in ids):\n    time.sleep(1)\n" \
    "jobs = [j for j in c.jobs() if j.id in ids]\n" \
    "print(json.dumps({'submit_s': t1 - t0, 'drain_s': max(j.record.ended for j in jobs) - t0,\n" \
    "                  'states': sorted({j.state for j in jobs})}))\n"


def slurm_queue(nodes: int, jobs: int, env: dict) -> dict:
    """``jobs`` one-node jobs submitted at once to a Slurm cluster of ``nodes``, drained end to end."""
    name = f"bq{nodes}"
    sh(CT + ["up", "--provider", "local", "--nodes", str(nodes), "--slots", str(SLOTS), "--name", name,
             "--scheduler", "slurm"], env)
    try:
        out = sh([sys.executable, "-c", QUEUE_JOB, name, str(jobs)], env, timeout=3600).stdout
        found = json.loads(out.strip().splitlines()[-1])
        if found["states"] != ["succeeded"]:
            raise SystemExit(f"queue: not every job succeeded: {found['states']}")
        return {"jobs": jobs, "nodes": nodes, **found}
    finally:
        sh(CT + ["down", "-c", name, "--yes"], env, check=False)


def slurm_report(results: dict, queue: dict | None, rounds: int) -> None:
    for nodes, res in results.items():
        med = {k: statistics.median(v) for k, v in res["start"].items()}
        base = med["mpirun path"]
        print(f"\n{nodes} local nodes x {SLOTS} slots, {rounds} alternating rounds, run -> every rank's first line:")
        print(f"{'path':36} {'median s':>9} {'x mpirun path':>14}")
        for key, value in med.items():
            print(f"{key:36} {value:9.2f} {value / base:14.2f}")
    if queue:
        print(f"\nqueue: {queue['jobs']} one-node jobs on {queue['nodes']} Slurm nodes: submitted in "
              f"{queue['submit_s']:.1f} s, drained in {queue['drain_s']:.1f} s: "
              f"{queue['drain_s'] / queue['jobs']:.2f} s per job")


def report(results: dict, rounds: int) -> None:
    for nodes, res in results.items():
        print(f"\n{nodes} local nodes x {SLOTS} slots, {rounds} alternating rounds, run -> every rank's first line "
              f"(load at the end: {' '.join(f'{x:.1f}' for x in res.get('load', ()))}):")
        print(f"{'contender':16} {'median s':>9} {'by hand':>16} {'its median s':>13} {'x by hand':>10}")
        for key, values in res["start"].items():
            mine, hand = statistics.median(values), statistics.median(res["by_hand"][key])
            print(f"{key:16} {mine:9.2f} {BY_HAND[key]:>16} {hand:13.2f} {mine / hand:10.2f}")
        for key, value in res.get("warm_ready_s", {}).items():
            print(f"({key}: warm launchers ready on every node {value:.1f} s after its untimed round)")
        for key, value in res["fail_fast"].items():
            print(f"fail fast ({key}): a rank exits -> the job's last process gone: {value:.2f} s")
    print("\ntargets: every launcher <= 1.0x its by-hand start; fail fast at 32 nodes <= 5 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--launchers", default=",".join(LAUNCHERS), help="clustertool's rows (their by-hand rows follow)")
    ap.add_argument("--fail", default=",".join(LAUNCHERS), help="launchers whose fail fast is timed at 32+ nodes")
    ap.add_argument("--slurm", action="store_true", help="the Slurm path: sbatch vs mpirun, then the queue")
    ap.add_argument("--queue", type=int, default=50, help="with --slurm: one-node jobs queued at once (0: none)")
    args = ap.parse_args()
    if args.slurm:
        return slurm_main(args)
    if not shutil.which("pdsh"):
        raise SystemExit("pdsh not found: apt-get install pdsh")
    home = Home("ct-bench-launch-")   # a throw-away clustertool home
    # as a user's shell: Python writes its bytecode (a session that says otherwise compiles clustertool anew
    # at every `run`, ~0.5 s CPU that no user pays)
    home.env.pop("PYTHONDONTWRITEBYTECODE", None)
    results = {}
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            results[n] = bench_size(n, args.rounds, home.path, home.env, args.launchers.split(","),
                                    [x for x in args.fail.split(",") if x])
    finally:
        home.remove()
    report(results, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def slurm_main(args: argparse.Namespace) -> None:
    home = Home("ct-bench-launch-slurm-")
    sizes = [int(x) for x in args.nodes.split(",")]
    results: dict = {}
    queue = None
    try:
        for n in sizes:
            results[n] = slurm_size(n, args.rounds, home.env)
        if args.queue:
            queue = slurm_queue(sizes[0], args.queue, home.env)
    finally:
        home.remove()
    slurm_report(results, queue, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"start": results, "queue": queue}, indent=2))


if __name__ == "__main__":
    main()
