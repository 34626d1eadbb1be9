#!/usr/bin/env python3
"""GPU proof: NCCL itself loads the clustertool plugin and runs its CollNet, next to NCCL's Socket.

For one machine with an NVIDIA GPU, the CUDA driver, PyTorch and NCCL (from PyPI), no
internet, maybe no compiler, make, ip, tc or MPI. Uses the plugin libraries in native/build
(built here when make and a C compiler exist, else prebuilt elsewhere and copied), starts
--ranks processes that NCCL takes for different hosts (a distinct NCCL_HOSTID each; all share
the GPU), and times float32 allreduce, smallest size first, for four variants:

    socket            NCCL's own Socket transport (the baseline)
    net               the plugin as NCCL's net only (NCCL_COLLNET_ENABLE=0)
    collnet-sharded   plugin + CollNet, sharded reduction (the plugin's tuner asks NCCL for CollNet)
    collnet-ring      plugin + CollNet, ring reduction

Where `ip` and `tc` exist and we are root, each rank lives in its own network namespace on a
veth link shaped to --rate; where they are missing, or the kernel refuses veth/bridge/tbf, ranks
talk over loopback. Everything fits --budget seconds: each variant gets an even share of what
is left, sizes stop when the next would overrun it, and the report (report.txt, report.json)
and ONE archive of every rank's log (logs.tar.gz) are written to --out before the budget ends,
also on SIGINT/SIGTERM. Exit status 0: NCCL loaded the plugin, ran CollNet where asked, every
element right; 1: it did not (the report says why); 2: bad arguments or no GPU/torch.

    python3 bench/nccl_gpu.py --out /tmp/proof                 # 4 ranks, 1M..256M, budget 480 s
    python3 bench/nccl_gpu.py --nccl-env NCCL_P2P_DISABLE=1    # a workaround for every rank
    make -C native gpu-check GPU_CHECK_ARGS="--budget 300"     # the same, via make
"""

from __future__ import annotations

import os
import sys

# A script's own folder comes first on sys.path, and bench/copy.py would then shadow the standard
# library's copy (tarfile and torch import it): this folder goes to the END instead.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse
import json
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import nccl_gpu_plan as plan  # noqa: E402

TOOLS = ("make", "cc", "gcc", "ip", "tc", "mpirun", "nvidia-smi")
RESERVE_S = 12.0     # kept back from --budget for teardown, the report and the archive


class Interrupted(Exception):
    pass


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
    p.add_argument("--budget", type=int, default=480,
                   help="seconds for the whole proof, report and archive included (default 480)")
    p.add_argument("--timeout", type=int, default=0, help="at most this many seconds per variant (default: its share)")
    p.add_argument("--nccl-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every rank of every variant (repeatable), recorded in the report")
    p.add_argument("--python", default=sys.executable, help="interpreter with torch for the ranks")
    p.add_argument("--out", type=Path, default=Path("nccl-gpu-proof"),
                   help="folder for report.txt, report.json and logs.tar.gz (default ./nccl-gpu-proof)")
    p.add_argument("--json", action="store_true", help="print report.json after the report")
    a = p.parse_args(argv)
    try:
        a.size_list = plan.size_list(a.sizes)
        a.rate_bits = plan.parse_rate(a.rate)
        a.extra_env = plan.parse_nccl_env(a.nccl_env)
        a.variant_list = [v.strip() for v in a.variants.split(",") if v.strip()]
        bad = [v for v in a.variant_list if v not in plan.VARIANTS]
        if bad or not a.variant_list:
            raise ValueError(f"unknown variant(s) {', '.join(bad) or '(none)'}; choose from {', '.join(plan.VARIANTS)}")
        if not 2 <= a.ranks <= 8:
            raise ValueError("--ranks must be 2..8")
        if a.iters < 1 or a.warmup < 0:
            raise ValueError("--iters must be >= 1 and --warmup >= 0")
        if a.budget < 30:
            raise ValueError("--budget must be at least 30 s")
    except ValueError as e:
        p.error(str(e))
    return a


def _run(cmds: list[list[str]], check: bool = True) -> None:
    for cmd in cmds:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")


def compiler() -> str | None:
    """The C compiler make would use: $CC, else gcc, else cc (native/Makefile's order)."""
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


def build_plugin(build: Path) -> str:
    """make the two libraries when make and a compiler exist; else use the ones built elsewhere.
    Returns a note for the report; RuntimeError when there is no library to use."""
    libs = [build / plan.NET_LIB, build / plan.TUNER_LIB]
    have = all(p.is_file() for p in libs)
    if shutil.which("make") and compiler():
        proc = subprocess.run(["make", "-C", str(plan.NATIVE), "plugins"], capture_output=True, text=True)
        if proc.returncode == 0:
            return "plugin built here with make"
        if not have:
            raise RuntimeError(f"building the plugin failed:\n{proc.stderr.strip()[-2000:]}")
        return f"make failed ({proc.stderr.strip().splitlines()[-1:] or ['?']}); using the libraries already built"
    if not have:
        missing = ", ".join(str(p) for p in libs if not p.is_file())
        raise RuntimeError(f"no plugin at {missing} and no make/C compiler to build it: run `make -C native plugins` "
                           "on an x86-64 machine and copy native/build here")
    return "prebuilt plugin libraries (no make or C compiler here)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PROBE = r"""
import json, sys
info = {}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        info["gpus"] = torch.cuda.device_count()
        info["gpu"] = torch.cuda.get_device_name(0)
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        info["cuda_runtime"] = torch.version.cuda
except Exception as e:
    info["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(info))
"""


def preflight(python: str) -> dict:
    """What the machine has: torch, CUDA, the GPU, NCCL's version, the driver, its compute mode,
    and which tools exist. `problem` is set when the proof cannot run at all."""
    info: dict = {"tools": {t: bool(shutil.which(t)) for t in TOOLS}}
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        info.update(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else
                    {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]})
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        info["error"] = f"{python}: {e}"
    if info["tools"]["nvidia-smi"]:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,compute_mode", "--format=csv,noheader"],
                           capture_output=True, text=True)
        if q.returncode == 0 and q.stdout.strip():
            info["driver"], _, mode = q.stdout.strip().splitlines()[0].partition(", ")
            info["compute_mode"] = mode.strip()
    if "error" in info:
        info["problem"] = f"{python} cannot import torch: {info['error']}"
    elif not info.get("cuda"):
        info["problem"] = "no CUDA GPU visible to torch (this proof needs one NVIDIA GPU)"
    elif info.get("compute_mode", "Default").replace("_", " ").lower().startswith("exclusive"):
        info["problem"] = (f"GPU compute mode is {info['compute_mode']}: the ranks share one GPU, which needs "
                           "Default (nvidia-smi -c DEFAULT)")
    return info


def preflight_line(info: dict, mode: str, note: str) -> str:
    tools = " ".join(f"{t}:{'yes' if ok else 'no'}" for t, ok in info["tools"].items())
    return (f"preflight: GPU {info.get('gpu', '?')} x{info.get('gpus', '?')}, driver {info.get('driver', '?')}, "
            f"compute mode {info.get('compute_mode', '?')}, torch {info.get('torch', '?')} "
            f"(CUDA {info.get('cuda_runtime', '?')}), NCCL {info.get('nccl', '?')}; {tools}; mode {mode}: {note}")


def _signal_to_exception(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def start_ranks(variant: str, args, mode: str, tag: str, work: Path, deadline: float):
    port = 29500 if mode == "netns" else free_port()
    table = None
    if variant.startswith("collnet") and not args.no_tuner:
        table = work / "tuner.csv"
        table.write_text(plan.tuner_table_text())
    procs, logs, outs = [], [], []
    sizes = ",".join(map(str, args.size_list))
    for r in range(args.ranks):
        env = plan.variant_env(variant, dict(os.environ), rank=r, world=args.ranks, mode=mode, port=port,
                               tag=tag, build=plan.NATIVE / "build", table=table, buffsize=args.buffsize,
                               extra=args.extra_env)
        if r == 0:
            (work / f"{variant}.env").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())
                                                         if k.startswith(("NCCL_", "CLUSTERTOOL_"))))
        out, log = work / f"{variant}.rank{r}.json", work / f"{variant}.rank{r}.log"
        argv = plan.rank_argv(mode, tag, r, args.python, [
            "--sizes", sizes, "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--deadline", f"{deadline:.1f}", "--out", str(out)])
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        logs.append(log)
        outs.append(out)
    return procs, logs, outs


def run_variant(run: plan.VariantRun, args, mode: str, tag: str, work: Path, nl) -> None:
    """Start the ranks, wait for all (or the first failure, or the share's end), stop what is left,
    and fill `run` from their logs and results, also when interrupted."""
    began = time.monotonic()
    procs, logs, outs, timed_out = [], [], [], False
    try:
        # the ranks stop by themselves 5 s before the share ends (time to write and tear down)
        procs, logs, outs = start_ranks(run.name, args, mode, tag, work, time.time() + run.share_s - 5)
        while True:
            states = [p.poll() for p in procs]   # poll every rank: a failed one ends the variant
            timed_out = time.monotonic() - began > run.share_s
            if None not in states or any(s not in (None, 0) for s in states) or timed_out:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)   # the rank's own session: it and its children
                p.wait()
        collect(run, procs, logs, outs, timed_out, args.size_list, nl)


def collect(run: plan.VariantRun, procs, logs, outs, timed_out: bool, size_list: list[int], nl) -> None:
    run.texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
    run.logs = [nl.parse_log(t) for t in run.texts]
    docs = []
    for o in outs:
        try:
            docs.append(json.loads(o.read_text()))
        except (OSError, ValueError):
            pass
    if docs:
        run.results = plan.merge_ranks(docs)
        run.nccl, run.torch = docs[0].get("nccl"), docs[0].get("torch")
        run.stopped_before = docs[0].get("stopped_before")
    # the rank that failed by itself, not the ones stopped because of it
    failed = sorted((p.returncode < 0, i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (0, None))
    if failed and not (timed_out and run.results and all(rc < 0 for _, _, rc in failed)):
        _, i, rc = failed[0]
        tail = run.texts[i].strip().splitlines()[-1:] or ["(no output)"]
        what = f"no result within its {run.share_s:.0f} s share of --budget" if timed_out and rc < 0 else f"exited {rc}"
        run.error = f"rank {i} {what}: {tail[0][:300]}"
    elif timed_out and run.results and not run.stopped_before:   # stopped mid-size by the share's end
        done = max(r["size"] for r in run.results)
        run.stopped_before = next((s for s in size_list if s > done), None)


def setup_network(args, mode: str, note: str, tag: str) -> tuple[str, str, int | None]:
    """Namespaces (or lo shaping); a kernel that refuses them falls back to loopback, unshaped."""
    root = os.geteuid() == 0
    shaped = args.rate_bits if (mode == "netns" or (args.shape_lo and root and shutil.which("tc"))) else None
    try:
        if mode == "netns":
            _run(plan.netns_setup_argvs(tag, args.ranks, args.rate_bits))
        elif shaped:
            _run(plan.lo_shape_argvs(shaped))
    except RuntimeError as e:
        teardown_network(args, mode, tag, shaped)
        why = str(e).splitlines()[0][:200]
        return "hostid", f"ranks on loopback with distinct NCCL_HOSTID (namespace/tc setup failed: {why})", None
    return mode, note, shaped


def teardown_network(args, mode: str, tag: str, shaped: int | None) -> None:
    if mode == "netns":
        _run(plan.netns_teardown_argvs(tag, args.ranks), check=False)
    elif shaped:
        _run(plan.lo_unshape_argvs(), check=False)


def write_outputs(out: Path, work: Path, text: str, doc: dict) -> None:
    """report.txt, report.json and logs.tar.gz (every rank's log, results and environment)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="nccl-gpu-logs")


def report_doc(args, pre: dict, mode: str, note: str, runs, code: int, problems: list[str], notes: list[str]):
    return {"preflight": pre, "mode": mode, "mode_note": note, "ranks": args.ranks, "budget_s": args.budget,
            "nccl_env": args.extra_env, "notes": notes, "verdict": "PASS" if code == 0 else "FAIL",
            "problems": problems,
            "variants": [{"variant": r.name, "share_s": round(r.share_s, 1), "results": r.results, "error": r.error,
                          "stopped_before": r.stopped_before, "nccl": r.nccl} for r in runs]}


def main(argv=None) -> int:
    args = parse_args(argv)
    ends = time.monotonic() + args.budget
    nl = plan.load_nccl_log()
    root = os.geteuid() == 0
    try:
        mode, note = plan.choose_mode(args.mode, bool(shutil.which("ip")), bool(shutil.which("tc")), root)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _signal_to_exception) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    signal.alarm(max(int(args.budget - RESERVE_S / 2), 1))   # a watchdog behind the shares
    tag = f"ctg{os.getpid() % 100000}"
    work = Path(tempfile.mkdtemp(prefix="ct-nccl-gpu-"))
    runs: list[plan.VariantRun] = []
    notes: list[str] = []
    pre: dict = {"tools": {}}
    shaped, fatal = None, None
    try:
        pre = preflight(args.python)
        fatal = pre.get("problem")
        if not fatal:
            notes.append(build_plugin(plan.NATIVE / "build"))
            mode, note, shaped = setup_network(args, mode, note, tag)
        print(preflight_line(pre, mode, note), file=sys.stderr, flush=True)
        for i, v in enumerate([] if fatal else args.variant_list):
            run = plan.VariantRun(v, share_s=plan.variant_shares(ends - RESERVE_S - time.monotonic(),
                                                                  len(args.variant_list) - i, args.timeout))
            runs.append(run)
            print(f"running {v} ({run.share_s:.0f} s at most) ...", file=sys.stderr, flush=True)
            run_variant(run, args, mode, tag, work, nl)
    except Interrupted as e:
        notes.append(f"interrupted by {e}: the report covers what finished before")
    except RuntimeError as e:
        fatal = str(e)
    finally:
        signal.alarm(0)
        for s, h in old.items():
            signal.signal(s, h)
        teardown_network(args, mode, tag, shaped)
    text, doc, code = finish(args, pre, mode, note, shaped, runs, notes, fatal, nl)
    try:
        write_outputs(args.out, work, text, doc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    print(f"\nwritten: {args.out}/report.txt, report.json, logs.tar.gz", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1))
    return code


def finish(args, pre, mode, note, shaped, runs, notes, fatal, nl):
    first = next((r for r in runs if r.nccl), None)
    nccl, torch = (first.nccl, first.torch) if first else (pre.get("nccl", "?"), pre.get("torch", "?"))
    header = f"NCCL {nccl} (torch {torch}), {args.ranks} ranks, {note}, links {args.rate if shaped else 'unshaped'}"
    lines = [preflight_line(pre, mode, note)]
    if args.extra_env:
        lines.append("--nccl-env: " + " ".join(f"{k}={v}" for k, v in args.extra_env.items()))
    lines += [f"note: {n}" for n in notes]
    if fatal:
        lines += ["", f"ERROR: {fatal}"]
        return "\n".join(lines), report_doc(args, pre, mode, note, runs, 2, [fatal], notes), 2
    lines += ["", plan.format_report(runs, nl, header), plan.format_evidence(runs, nl)]
    code, problems = plan.verdict(runs, nl, args.variant_list)
    lines.append("\n" + ("PASS: NCCL loaded the plugin and ran CollNet where asked; every element right" if code == 0
                         else "FAIL:\n  " + "\n  ".join(problems)))
    return "\n".join(lines), report_doc(args, pre, mode, note, runs, code, problems, notes), code


if __name__ == "__main__":
    sys.exit(main())
