#!/usr/bin/env python3
"""GPU proof: NCCL itself loads the clustertool plugin and runs its CollNet, next to NCCL's Socket.

For one machine with an NVIDIA GPU, the CUDA driver, PyTorch and NCCL (from PyPI), no
internet, maybe no MPI. Builds the plugin if needed (gcc + make), starts --ranks processes
that NCCL takes for different hosts (a distinct NCCL_HOSTID each; all use the GPU), and
times float32 allreduce over --sizes for four variants:

    socket            NCCL's own Socket transport (the baseline)
    net               the plugin as NCCL's net only (NCCL_COLLNET_ENABLE=0)
    collnet-sharded   plugin + CollNet, sharded reduction (the plugin's tuner asks NCCL for CollNet)
    collnet-ring      plugin + CollNet, ring reduction

Where `ip` and `tc` exist and we are root, each rank lives in its own network namespace on
a veth link shaped to --rate at both ends; otherwise ranks talk over loopback (shaped with
tc on lo only with --shape-lo, as root). Prints time, algbw, busbw and #wrong (against a
CPU reference) per size and variant, busbw side by side, and the NCCL log lines that show
which net, plugin ABI and algorithm ran. Exit status 1 if NCCL did not load the plugin, did
not run CollNet where a collnet variant asked for it, or any element was wrong; 2 for bad
arguments or a machine that cannot run it (no GPU, no torch).

    sudo python3 bench/nccl_gpu.py                       # 4 ranks, 1M..256M, links 10gbit
    python3 bench/nccl_gpu.py --ranks 2 --mode hostid    # no root: loopback, unshaped
    make -C native gpu-check                             # the same as the first, via make
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nccl_gpu_plan as plan  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nccl_gpu.py",
                                description="NCCL loads the plugin and runs CollNet: proof on a GPU")
    p.add_argument("--ranks", type=int, default=4, help="processes, each a different host to NCCL (2-8; default 4)")
    p.add_argument("--sizes", default="1M:256M", help="A:B doubling, or a list A,B,C (default 1M:256M)")
    p.add_argument("--iters", type=int, default=5, help="timed allreduces per size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed allreduces per size first (default 2)")
    p.add_argument("--variants", default=",".join(plan.VARIANTS), help="subset of " + ",".join(plan.VARIANTS))
    p.add_argument("--mode", choices=("auto", "netns", "hostid"), default="auto",
                   help="netns: a namespace per rank on shaped veth links (root, ip, tc); hostid: loopback")
    p.add_argument("--rate", default="10gbit", help="link shaping, e.g. 10gbit, 400mbit, none (default 10gbit)")
    p.add_argument("--shape-lo", action="store_true", help="hostid mode: shape lo with tc (affects the whole machine)")
    p.add_argument("--buffsize", type=plan.parse_size, default=None, help="NCCL_BUFFSIZE for every variant")
    p.add_argument("--no-tuner", action="store_true",
                   help="collnet variants: let NCCL choose instead of asking for CollNet")
    p.add_argument("--timeout", type=int, default=900, help="seconds per variant (default 900)")
    p.add_argument("--python", default=sys.executable, help="interpreter with torch for the ranks")
    p.add_argument("--keep-logs", type=Path, default=None, help="copy every rank's log and results here")
    p.add_argument("--json", action="store_true", help="print the results as JSON after the report")
    a = p.parse_args(argv)
    try:
        a.size_list = plan.size_list(a.sizes)
        a.rate_bits = plan.parse_rate(a.rate)
        a.variant_list = [v.strip() for v in a.variants.split(",") if v.strip()]
        bad = [v for v in a.variant_list if v not in plan.VARIANTS]
        if bad or not a.variant_list:
            raise ValueError(f"unknown variant(s) {', '.join(bad) or '(none)'}; choose from {', '.join(plan.VARIANTS)}")
        if not 2 <= a.ranks <= 8:
            raise ValueError("--ranks must be 2..8")
        if a.iters < 1 or a.warmup < 0:
            raise ValueError("--iters must be >= 1 and --warmup >= 0")
    except ValueError as e:
        p.error(str(e))
    return a


def _run(cmds: list[list[str]], check: bool = True) -> None:
    for cmd in cmds:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")


def build_plugin(build: Path) -> None:
    """make the two libraries (not collnet_bench, which needs MPI); reuse them when make is absent."""
    libs = [build / plan.NET_LIB, build / plan.TUNER_LIB]
    if shutil.which("make") and shutil.which(os.environ.get("CC", "gcc")):
        proc = subprocess.run(["make", "-C", str(plan.NATIVE), "plugins"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the plugin failed:\n{proc.stderr.strip()[-2000:]}")
    missing = [str(p) for p in libs if not p.is_file()]
    if missing:
        raise RuntimeError(f"no plugin at {', '.join(missing)} and no make/gcc to build it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(variant: str, args, mode: str, tag: str, work: Path, nl) -> plan.VariantRun:
    run = plan.VariantRun(variant)
    port = 29500 if mode == "netns" else free_port()
    table = None
    if variant.startswith("collnet") and not args.no_tuner:
        table = work / "tuner.csv"
        table.write_text(plan.tuner_table_text())
    procs, logs, outs = [], [], []
    sizes = ",".join(map(str, args.size_list))
    try:
        for r in range(args.ranks):
            env = plan.variant_env(variant, dict(os.environ), rank=r, world=args.ranks, mode=mode, port=port,
                                   tag=tag, build=plan.NATIVE / "build", table=table, buffsize=args.buffsize)
            out, log = work / f"{variant}.rank{r}.json", work / f"{variant}.rank{r}.log"
            argv = plan.rank_argv(mode, tag, r, args.python, ["--sizes", sizes, "--iters", str(args.iters),
                                                              "--warmup", str(args.warmup), "--out", str(out)])
            fh = open(log, "w")
            procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))
            fh.close()
            logs.append(log)
            outs.append(out)
        deadline, timed_out = time.monotonic() + args.timeout, False
        while True:
            states = [p.poll() for p in procs]   # poll every rank: a failed one ends the variant
            timed_out = time.monotonic() > deadline
            if None not in states or any(s not in (None, 0) for s in states) or timed_out:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)   # the rank's own session: it and its children
                p.wait()
    run.texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
    run.logs = [nl.parse_log(t) for t in run.texts]
    # the rank that failed by itself, not the ones stopped because of it
    failed = sorted(((p.returncode < 0, i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0))
    if failed:
        _, i, rc = failed[0]
        tail = run.texts[i].strip().splitlines()[-1:] or ["(no output)"]
        what = f"no result after {args.timeout} s" if timed_out and rc < 0 else f"exited {rc}"
        run.error = f"rank {i} {what}: {tail[0][:300]}"
    docs = [json.loads(o.read_text()) for o in outs if o.exists()]
    if docs:
        run.results = plan.merge_ranks(docs)
        run.nccl, run.torch = docs[0].get("nccl"), docs[0].get("torch")
    return run


def preflight(python: str) -> str | None:
    probe = ("import torch, sys; ok = torch.cuda.is_available(); "
             "print(torch.__version__, torch.cuda.device_count()); sys.exit(0 if ok else 3)")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if proc.returncode == 3:
        return "no CUDA GPU visible to torch (this proof needs one NVIDIA GPU)"
    if proc.returncode != 0:
        return f"{python} cannot import torch: {proc.stderr.strip().splitlines()[-1:] or ['?']}"
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    nl = plan.load_nccl_log()
    root = os.geteuid() == 0
    try:
        mode, note = plan.choose_mode(args.mode, bool(shutil.which("ip")), bool(shutil.which("tc")), root)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problem = preflight(args.python)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        build_plugin(plan.NATIVE / "build")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tag = f"ctg{os.getpid() % 100000}"
    shaped = args.rate_bits if (mode == "netns" or (args.shape_lo and root and shutil.which("tc"))) else None
    work = Path(tempfile.mkdtemp(prefix="ct-nccl-gpu-"))
    runs = []
    try:
        if mode == "netns":
            _run(plan.netns_setup_argvs(tag, args.ranks, args.rate_bits))
        elif shaped:
            _run(plan.lo_shape_argvs(shaped))
        for v in args.variant_list:
            print(f"running {v} ...", file=sys.stderr, flush=True)
            runs.append(run_variant(v, args, mode, tag, work, nl))
    finally:
        if mode == "netns":
            _run(plan.netns_teardown_argvs(tag, args.ranks), check=False)
        elif shaped:
            _run(plan.lo_unshape_argvs(), check=False)
        if args.keep_logs:
            shutil.copytree(work, args.keep_logs, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    first = next((r for r in runs if r.nccl), None)
    header = (f"NCCL {first.nccl if first else '?'} (torch {first.torch if first else '?'}), {args.ranks} ranks, "
              f"{note}, links {args.rate if shaped else 'unshaped'}")
    print(plan.format_report(runs, nl, header))
    print(plan.format_evidence(runs, nl))
    code, problems = plan.verdict(runs, nl)
    print("\n" + ("PASS: NCCL loaded the plugin and ran CollNet where asked; every element right" if code == 0
                  else "FAIL:\n  " + "\n  ".join(problems)))
    if args.json:
        print(json.dumps([{"variant": r.name, "results": r.results, "error": r.error} for r in runs], indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
