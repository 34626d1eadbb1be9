#!/usr/bin/env python3
"""Benchmark: how long a job takes to recover from a lost node, on a local cluster (default 8 nodes).

A PyTorch DDP job (examples/ddp_checkpoint.py, gloo on CPU, one rank per node, a checkpoint per step on
the leader's disk) runs with `--restarts 1 --replace-failed --follow`; once it has checkpointed a few
steps, the benchmark kills one member's whole namespace (its sshd, its rank, everything) and measures,
from that moment:

  (a) every rank running again: each node's rank wrapper of the next attempt has started (its
      ``ranks/<node>.<rank>`` record, on that node's disk, is newer than the kill);
  (b) the first step after the resume: the leader's checkpoint is written again.

and the phases in between, from the job's own records (attempts.json, the `replaced.N` mark): the
leader's restart loop seeing the loss, the recovery loop's `replace` (on this machine), and the
restart.  No dataset is copied back here (a `recover --copy`/`replace --copy` of one would come on top,
reported apart by that command).

    .venv/bin/python bench/recovery.py [--nodes 8] [--kill node-5]   (as root)

The figures depend on the box: on a loaded 2-core machine, 8 PyTorch imports dominate (b).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
from benchlib import CLI, REPO, Home  # noqa: E402

from clustertool.workloads import node_python  # noqa: E402


def _state(home: Home, name: str) -> dict:
    return json.loads((Path(home.path) / "clusters" / f"{name}.json").read_text())["provider_state"]


def _pids_in_netns(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _ckpt_mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def measure(home: Home, name: str, nodes: int, victim: str, script: Path) -> dict:
    nodes_dir = Path(_state(home, name)["nodes_dir"])
    argv = CLI + ["run", "-c", name, "--restarts", "1", "--replace-failed", "--follow", "--no-tag-output",
                  "-x", "STEPS=40", "-x", "STEP_S=0.5", "--", *node_python(), str(script)]
    proc = subprocess.Popen(argv, env=home.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    job_id = None
    while job_id is None:
        if proc.poll() is not None:
            raise SystemExit("the job did not start:\n" + "".join(err)[-2000:])
        text = "".join(err) + "".join(out)
        found = re.search(r"(j\d{4}-[0-9a-f]{6})", text)
        job_id = found.group(1) if found else None
        time.sleep(0.1)
    leader_home = nodes_dir / "node-1" / "home"
    ckpt = leader_home / f"ckpt-{job_id}.pt"
    job_dir = leader_home / ".clustertool" / "jobs" / job_id
    while _ckpt_mtime(ckpt) == 0.0 or time.time() - _ckpt_mtime(ckpt) > 5:  # training, a step or more done
        time.sleep(0.1)
    time.sleep(2.0)
    index = int(victim.split("-")[1])
    ns = f"ct-{name}-{index}"
    death = time.time()
    for _ in range(5):
        pids = _pids_in_netns(ns)
        if not pids:
            break
        subprocess.run(["kill", "-9", *map(str, pids)], stderr=subprocess.DEVNULL)
    running = first_step = None
    deadline = time.monotonic() + 600
    while first_step is None and time.monotonic() < deadline:
        if running is None:
            stamps = []
            for k in range(1, nodes + 1):
                rec = sorted((nodes_dir / f"node-{k}" / "home" / ".clustertool" / "jobs" / job_id / "ranks").glob(
                    f"node-{k}.*"))
                stamps.append(max((_ckpt_mtime(r) for r in rec), default=0.0))
            if all(s > death for s in stamps):
                running = max(stamps)
        elif _ckpt_mtime(ckpt) > running:
            first_step = _ckpt_mtime(ckpt)
        time.sleep(0.05)
    code = proc.wait(timeout=600)
    attempts = json.loads((job_dir / "attempts.json").read_text())
    a1 = attempts["attempts"][0]
    marks = sorted(job_dir.glob("replaced.*"))
    told = json.loads(marks[0].read_text())["at"] if marks else None
    return {"job": job_id, "exit": code, "death": death, "attempt1_end": a1["end"], "cause": a1["cause"],
            "replaced_at": told, "attempt2_start": attempts["attempts"][1]["start"] if len(attempts["attempts"]) > 1
            else None, "running": running, "first_step": first_step, "verdict": attempts["verdict"],
            "replace_lines": [line.strip() for line in err if "replaced in" in line]}


def table(r: dict) -> list[tuple[str, str]]:
    def since(t):
        return f"{t - r['death']:6.1f}" if t else "     -"

    rows = [("leader's restart loop sees the loss (attempt 1 ended)", since(r["attempt1_end"])),
            ("node replaced, leader told to go on", since(r["replaced_at"])),
            ("attempt 2 started", since(r["attempt2_start"])),
            ("(a) every rank running again", since(r["running"])),
            ("(b) first step after the resume", since(r["first_step"]))]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--kill", default=None, help="the member to kill (default: the last node)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    home = Home("ct-bench-recovery-")
    name = f"brc-{uuid.uuid4().hex[:6]}"
    script = Path("/var/tmp") / f"ct-bench-recovery-{uuid.uuid4().hex[:6]}.py"  # every local node sees /var/tmp
    script.write_text((REPO / "examples" / "ddp_checkpoint.py").read_text())
    victim = args.kill or f"node-{args.nodes}"
    try:
        t0 = time.monotonic()
        home.cli("up", "--provider", "local", "--nodes", str(args.nodes), "--name", name, "--slots", "1")
        print(f"cluster of {args.nodes} nodes up in {time.monotonic() - t0:.1f}s; killing {victim} mid-job")
        r = measure(home, name, args.nodes, victim, script)
        print(f"\njob {r['job']}: exit {r['exit']}, attempt 1: {r['cause']}; {r['verdict']}")
        print(f"{'seconds after the node died':<58}")
        for label, value in table(r):
            print(f"  {label:<56}{value}")
        for line in r["replace_lines"]:
            print(f"  recovery loop: {line.lstrip('» ')}")
        out = REPO / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(r, indent=2))
    finally:
        home.cli("down", "-c", name, "--yes", check=False)
        home.remove()
        script.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
