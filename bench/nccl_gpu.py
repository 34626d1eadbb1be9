#!/usr/bin/env python3
"""GPU proof: NCCL itself loads the clustertool plugin and runs its CollNet, next to NCCL's Socket.

For one machine with an NVIDIA GPU, the CUDA driver, PyTorch and NCCL (from PyPI), no
internet, maybe no compiler, make, ip, tc or MPI. Uses the plugin libraries in native/build
(built here when make and a C compiler exist, else prebuilt elsewhere and copied), starts
--ranks processes that NCCL takes for different hosts (a distinct NCCL_HOSTID each; all share
the GPU, through CUDA MPS where it starts), and times float32 allreduce, smallest size first:

    socket            NCCL's own Socket transport (the baseline; never paced)
    net               the plugin as NCCL's net only (NCCL_COLLNET_ENABLE=0)
    collnet-sharded   plugin + CollNet, sharded reduction (the plugin's tuner asks NCCL for CollNet)
    collnet-ring      plugin + CollNet, ring reduction
    collnet-servers   plugin + CollNet on --ranks reduction servers the proof starts (clustertool-reducer)
    ddp-socket, ddp-net, ddp-sharded, ddp-servers
                      a short torch DDP training loop with the environment of socket, net, ... (samples/s)

NAME@RATE paces a plugin variant: its ranks and reducers get CLUSTERTOOL_LINK_RATE=RATE (one token
bucket per process and direction); --pace RATE paces every plugin variant of --variants. NCCL's
Socket cannot be paced and stays a reference. Every plugin rank writes its CollNet stats
(CLUSTERTOOL_COLLNET_STATS) to a file the report reads. `--plan full` is issue 31's run: an unpaced
pass (4M..64M), a paced pass at 1gbit (64M; net, sharded, servers), then ddp-socket and ddp-net,
ddp-servers paced, in --budget 420.

Where `ip` and `tc` exist and we are root, each rank (and reducer) lives in its own network
namespace on a veth link shaped to --rate; else ranks talk over loopback. Everything fits
--budget seconds: each variant gets an even share of what is left, sizes (and iterations) stop
when the next would overrun it, and the report (report.txt, report.json) and ONE archive of every
rank's and reducer's log (logs.tar.gz) are written to --out, also on SIGINT/SIGTERM; no rank,
reducer, MPS daemon or namespace is left. Exit status 0: NCCL loaded the plugin, ran CollNet (and
the servers) where asked, every element right; 1: it did not (the report says why); 2: bad
arguments or no GPU/torch.

    python3 bench/nccl_gpu.py --plan full --out $OUT          # issue 31's whole run, 420 s
    python3 bench/nccl_gpu.py --out /tmp/proof                 # 4 variants, 1M..256M, budget 480 s
    python3 bench/nccl_gpu.py --variants net,collnet-servers --pace 1gbit --sizes 64M
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
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import nccl_gpu_plan as plan  # noqa: E402
import nccl_gpu_procs as procs  # noqa: E402
import nccl_gpu_report as report  # noqa: E402
from nccl_gpu_probe import TOOLS, build_plugin, compiler, free_port, preflight, preflight_line  # noqa: E402,F401

RESERVE_S = 12.0     # kept back from --budget for teardown, the report and the archive
Interrupted = procs.Interrupted


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nccl_gpu.py",
                                description="NCCL loads the plugin and runs CollNet: proof on a GPU")
    p.add_argument("--plan", choices=sorted(plan.PLANS), default="basic",
                   help="argument set: basic (4 variants, 1M:256M, budget 480) or full (issue 31: unpaced and "
                        "paced passes, reduction servers, DDP; budget 420); other flags override it")
    p.add_argument("--prebuilt", action="store_true",
                   help="use native/build as it is (built elsewhere), even where make and a C compiler exist")
    p.add_argument("--ranks", type=int, default=4, help="processes, each a different host to NCCL (2-8; default 4)")
    p.add_argument("--sizes", default=None, help="A:B doubling, or a list A,B,C (basic: 1M:256M; full: 4M:64M)")
    p.add_argument("--paced-sizes", default=None, help="sizes for paced variants (default: --sizes; full: 64M)")
    p.add_argument("--iters", type=int, default=None, help="timed allreduces per size (basic 5, full 20)")
    p.add_argument("--warmup", type=int, default=None, help="untimed allreduces per size first (basic 2, full 3)")
    p.add_argument("--variants", default=None,
                   help="NAME[@RATE],... from " + ",".join(plan.ALL_VARIANTS) + " (@RATE paces that one)")
    p.add_argument("--pace", default=None, metavar="RATE",
                   help="CLUSTERTOOL_LINK_RATE (e.g. 1gbit) for every plugin variant and reducer without its own "
                        "@RATE; with --plan full, the paced pass's rate (default 1gbit)")
    p.add_argument("--ddp-seconds", type=float, default=None, help="timed training per ddp variant (default 25)")
    p.add_argument("--ddp-batch", type=int, default=32, help="samples per rank and step (default 32)")
    p.add_argument("--ddp-model", default="2048x6", help="WIDTHxLAYERS of the MLP (default 2048x6: 25.2M params)")
    p.add_argument("--no-mps", action="store_true", help="do not start CUDA MPS (ranks then take turns on the GPU)")
    p.add_argument("--mode", choices=("auto", "netns", "hostid"), default="auto",
                   help="netns: a namespace per rank on shaped veth links (root, ip, tc); hostid: loopback")
    p.add_argument("--rate", default="10gbit", help="netns link shaping, e.g. 10gbit, 400mbit, none (default 10gbit)")
    p.add_argument("--shape-lo", action="store_true", help="hostid mode: shape lo with tc (affects the whole machine)")
    p.add_argument("--buffsize", type=plan.parse_size, default=None, help="NCCL_BUFFSIZE for every variant")
    p.add_argument("--no-tuner", action="store_true",
                   help="collnet variants: let NCCL choose instead of asking for CollNet")
    p.add_argument("--budget", type=int, default=None,
                   help="seconds for the whole proof, report and archive included (basic 480, full 420)")
    p.add_argument("--timeout", type=int, default=0, help="at most this many seconds per variant (default: its share)")
    p.add_argument("--nccl-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every rank of every variant (repeatable), recorded in the report")
    p.add_argument("--python", default=sys.executable, help="interpreter with torch for the ranks")
    p.add_argument("--out", type=Path, default=Path("nccl-gpu-proof"),
                   help="folder for report.txt, report.json and logs.tar.gz (default ./nccl-gpu-proof)")
    p.add_argument("--json", action="store_true", help="print report.json after the report")
    a = p.parse_args(argv)
    preset = plan.PLANS[a.plan]
    for key in ("sizes", "iters", "warmup", "budget"):
        if getattr(a, key) is None:
            setattr(a, key, preset[key])
    a.ddp_seconds = a.ddp_seconds if a.ddp_seconds is not None else preset.get("ddp_seconds", 25)
    try:
        a.size_list = plan.size_list(a.sizes)
        paced = a.paced_sizes or (preset.get("paced_sizes") if a.sizes == preset["sizes"] else None) or a.sizes
        a.paced_size_list = plan.size_list(paced)
        a.rate_bits = plan.parse_rate(a.rate)
        a.extra_env = plan.parse_nccl_env(a.nccl_env)
        if a.variants is None and "paced" in preset:
            a.specs = plan.parse_variants(plan.plan_variants(preset, a.pace))
        else:
            a.specs = plan.parse_variants(a.variants or preset["variants"], a.pace)
        a.variant_list = [s.name for s in a.specs]
        width, _, layers = a.ddp_model.partition("x")
        a.ddp_width, a.ddp_layers = int(width), int(layers)
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


def _signal_to_exception(signum, frame):
    procs.on_signal(signum, frame)


def _worker_args(spec: plan.Spec, args, deadline: float, out: Path) -> tuple[Path, list[str]]:
    if spec.ddp:
        return plan.DDP_WORKER, ["--seconds", str(args.ddp_seconds), "--batch", str(args.ddp_batch),
                                 "--width", str(args.ddp_width), "--layers", str(args.ddp_layers),
                                 "--deadline", f"{deadline:.1f}", "--out", str(out)]
    sizes = args.paced_size_list if spec.pace else args.size_list
    return plan.WORKER, ["--sizes", ",".join(map(str, sizes)), "--iters", str(args.iters), "--warmup",
                         str(args.warmup), "--deadline", f"{deadline:.1f}", "--out", str(out)]


def start_ranks(spec: plan.Spec, args, ctx: dict, work: Path, deadline: float, reducers: list[str]):
    mode, tag = ctx["mode"], ctx["tag"]
    port = 29500 if mode == "netns" else free_port()
    table = None
    if spec.collnet and not args.no_tuner:
        table = work / "tuner.csv"
        table.write_text(plan.tuner_table_text())
    ranks, logs, outs, stats = [], [], [], []
    base = dict(os.environ, **ctx["mps"].env)
    for r in range(args.ranks):
        stat = work / f"{spec.name}.rank{r}.stats.jsonl"
        env = plan.variant_env(spec.base, base, rank=r, world=args.ranks, mode=mode, port=port, tag=tag,
                               build=plan.NATIVE / "build", table=table, buffsize=args.buffsize, extra=args.extra_env,
                               reducers=reducers, pace=spec.pace, stats=stat)
        if r == 0:
            (work / f"{spec.name}.env").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())
                                                           if k.startswith(("NCCL_", "CLUSTERTOOL_", "CUDA_MPS_"))))
        out, log = work / f"{spec.name}.rank{r}.json", work / f"{spec.name}.rank{r}.log"
        worker, wargs = _worker_args(spec, args, deadline, out)
        argv = plan.rank_argv(mode, tag, r, args.python, wargs, worker)
        with open(log, "w") as fh:
            try:
                ranks.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            except OSError:
                procs.stop_group(ranks, 0.0)   # no rank of a variant that cannot start stays behind
                raise
        logs.append(log)
        outs.append(out)
        stats.append(stat)
    return ranks, logs, outs, stats


def start_servers(spec: plan.Spec, args, ctx: dict, work: Path) -> procs.Reducers:
    binary = plan.NATIVE / "build" / plan.REDUCER
    if not binary.is_file():
        return procs.Reducers(error=f"no reduction server at {binary}: build it with `make -C native plugins`")
    env = plan.reducer_env(dict(os.environ), spec.pace)
    files = [work / f"{spec.name}.reducer{i}.port" for i in range(args.ranks)]
    logs = [work / f"{spec.name}.reducer{i}.log" for i in range(args.ranks)]
    argvs = [plan.reducer_argv(ctx["mode"], ctx["tag"], i, binary, f) for i, f in enumerate(files)]
    (work / f"{spec.name}.reducers.env").write_text(
        "".join(" ".join(a) + "\n" for a in argvs)
        + "".join(f"{k}={v}\n" for k, v in sorted(env.items()) if k.startswith("CLUSTERTOOL_")))
    return procs.start_reducers(argvs, files, logs, env)


def run_variant(run: plan.VariantRun, args, ctx: dict, work: Path, nl) -> None:
    """Start the reducers (servers) and the ranks, wait for all ranks (or the first failure, or the
    share's end), stop what is left, and fill `run` from their logs and results, also when interrupted."""
    spec = run.spec
    assert spec is not None
    began = time.monotonic()
    ranks, logs, outs, stats, timed_out = [], [], [], [], False
    red = procs.Reducers()
    try:
        with procs.cleanup():   # a signal waits until what starts here is known, so it can be stopped
            if spec.servers:
                red = start_servers(spec, args, ctx, work)
            if not red.error:
                deadline = time.time() + run.share_s - plan.RANK_MARGIN_S
                ranks, logs, outs, stats = start_ranks(spec, args, ctx, work, deadline, red.endpoints)
        if red.error:
            run.error = red.error
            return
        while True:
            states = [p.poll() for p in ranks]   # poll every rank: a failed one ends the variant
            timed_out = time.monotonic() - began > run.share_s
            if None not in states or any(s not in (None, 0) for s in states) or timed_out:
                break
            time.sleep(0.5)
    finally:
        with procs.cleanup():
            procs.stop_group(ranks, 0.0)       # the rank's own session: it and its children
            procs.stop_group(red.procs, 3.0)   # TERM, then KILL after 3 s
            run.reducer_texts = [p.read_text(errors="replace") for p in red.logs if p.exists()]
            if ranks:
                sizes = args.paced_size_list if spec.pace else args.size_list
                collect(run, ranks, logs, outs, stats, timed_out, sizes, nl)


def collect(run: plan.VariantRun, ranks, logs, outs, stats, timed_out: bool, size_list: list[int], nl) -> None:
    run.texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
    run.logs = [nl.parse_log(t) for t in run.texts]
    run.stats = plan.parse_stats([p.read_text(errors="replace") for p in stats if p.exists()] + run.texts)
    docs = []
    for o in outs:
        try:
            docs.append(json.loads(o.read_text()))
        except (OSError, ValueError):
            pass
    if docs and run.spec and run.spec.ddp:
        run.ddp = plan.merge_ddp(docs)
        run.nccl, run.torch = docs[0].get("nccl"), docs[0].get("torch")
    elif docs:
        run.results = plan.merge_ranks(docs)
        run.nccl, run.torch = docs[0].get("nccl"), docs[0].get("torch")
        run.stopped_before = docs[0].get("stopped_before")
    # the rank that failed by itself, not the ones stopped because of it
    failed = sorted((p.returncode < 0, i, p.returncode) for i, p in enumerate(ranks) if p.returncode not in (0, None))
    done = bool(run.results or run.ddp)
    if failed and not (timed_out and done and all(rc < 0 for _, _, rc in failed)):
        _, i, rc = failed[0]
        tail = run.texts[i].strip().splitlines()[-1:] or ["(no output)"]
        what = f"no result within its {run.share_s:.0f} s share of --budget" if timed_out and rc < 0 else f"exited {rc}"
        run.error = f"rank {i} {what}: {tail[0][:300]}"
    elif timed_out and run.results and not run.stopped_before:   # stopped mid-size by the share's end
        done_size = max(r["size"] for r in run.results)
        run.stopped_before = next((s for s in size_list if s > done_size), None)


def setup_network(args, mode: str, note: str, tag: str) -> tuple[str, str, int | None]:
    """Namespaces (or lo shaping); a kernel that refuses them falls back to loopback, unshaped."""
    root = os.geteuid() == 0
    shaped = args.rate_bits if (mode == "netns" or (args.shape_lo and root and shutil.which("tc"))) else None
    try:
        if mode == "netns":
            _run(plan.netns_setup_argvs(tag, args.ranks, args.rate_bits, _servers(args)))
        elif shaped:
            _run(plan.lo_shape_argvs(shaped))
    except RuntimeError as e:
        teardown_network(args, mode, tag, shaped)
        why = str(e).splitlines()[0][:200]
        return "hostid", f"ranks on loopback with distinct NCCL_HOSTID (namespace/tc setup failed: {why})", None
    return mode, note, shaped


def _servers(args) -> int:
    return args.ranks if any(s.servers for s in args.specs) else 0


def teardown_network(args, mode: str, tag: str, shaped: int | None) -> None:
    if mode == "netns":
        _run(plan.netns_teardown_argvs(tag, args.ranks, _servers(args)), check=False)
    elif shaped:
        _run(plan.lo_unshape_argvs(), check=False)


def write_outputs(out: Path, work: Path, text: str, doc: dict) -> None:
    """report.txt, report.json and logs.tar.gz (every rank's and reducer's log, results and environment)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="nccl-gpu-logs")


def report_doc(args, pre: dict, ctx: dict, runs, code: int, problems: list[str], notes: list[str]):
    return {"preflight": pre, "mode": ctx["mode"], "mode_note": ctx["note"], "mps": ctx["mps"].note,
            "ranks": args.ranks, "budget_s": args.budget, "plan": args.plan, "nccl_env": args.extra_env,
            "notes": notes, "verdict": "PASS" if code == 0 else "FAIL", "problems": problems,
            "targets": report.targets(runs), "stats": [s for r in runs if (s := report.stats_rows(r))],
            "variants": [{"variant": r.name, "base": r.spec.base if r.spec else r.name,
                          "pace": r.spec.pace if r.spec else None, "share_s": round(r.share_s, 1),
                          "results": r.results, "ddp": r.ddp, "error": r.error, "stopped_before": r.stopped_before,
                          "nccl": r.nccl, "stats": r.stats} for r in runs]}


def _prepare(args, ctx: dict, work: Path, notes: list[str]) -> dict:
    """MPS (where it starts), the preflight probe under it (a CUDA client that fails under MPS turns
    MPS off and probes again), the plugin build and the network."""
    with procs.cleanup():   # the daemon detaches: a signal waits until ctx knows it
        ctx["mps"] = procs.start_mps(work / "mps-log", ctx["tag"], args.no_mps)
    pre = preflight(args.python, ctx["mps"].env, mps=ctx["mps"].on)
    if ctx["mps"].on and pre.get("problem"):
        with procs.cleanup():
            procs.stop_mps(ctx["mps"])
        ctx["mps"] = procs.Mps(note=f"off (a CUDA client failed under MPS: {pre['problem'][:200]})")
        pre = preflight(args.python, {}, mps=False)
    if not pre.get("problem"):
        notes.append(build_plugin(plan.NATIVE / "build", prebuilt=args.prebuilt))
        ctx["mode"], ctx["note"], ctx["shaped"] = setup_network(args, ctx["mode"], ctx["note"], ctx["tag"])
    return pre


def _start(spec: plan.Spec, left: int, ends: float, args, ctx: dict, work: Path, runs: list, nl) -> plan.VariantRun:
    share = plan.variant_shares(ends - RESERVE_S - time.monotonic(), left, args.timeout)
    run = plan.VariantRun(spec.name, share_s=share, spec=spec)
    runs.append(run)
    print(f"running {spec.name} ({run.share_s:.0f} s at most) ...", file=sys.stderr, flush=True)
    run_variant(run, args, ctx, work, nl)
    return run


def _mps_off_after(run: plan.VariantRun, ctx: dict, work: Path, notes: list[str]) -> None:
    """The first variant failed under MPS: stop it, keep that attempt's files under under-mps/."""
    with procs.cleanup():
        procs.stop_mps(ctx["mps"])
    kept = work / "under-mps"
    kept.mkdir(exist_ok=True)
    for f in work.glob(f"{run.name}.*"):
        f.rename(kept / f.name)
    ctx["mps"] = procs.Mps(note=f"off (the first variant failed under MPS and ran again without it: {run.error})")
    notes.append(f"{run.name} failed under MPS ({run.error}); MPS stopped, {run.name} ran again without it "
                 "(that attempt's logs: under-mps/ in the archive)")


def main(argv=None) -> int:
    args = parse_args(argv)
    ends = time.monotonic() + args.budget
    nl = plan.load_nccl_log()
    try:
        mode, note = plan.choose_mode(args.mode, bool(shutil.which("ip")), bool(shutil.which("tc")),
                                      os.geteuid() == 0)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _signal_to_exception) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    signal.alarm(max(int(args.budget - RESERVE_S / 2), 1))   # a watchdog behind the shares
    ctx = {"mode": mode, "note": note, "shaped": None, "tag": f"ctg{os.getpid() % 100000}", "mps": procs.Mps()}
    work = Path(tempfile.mkdtemp(prefix="ct-nccl-gpu-"))
    runs: list[plan.VariantRun] = []
    notes: list[str] = []
    pre: dict = {"tools": {}}
    fatal = None
    try:
        pre = _prepare(args, ctx, work, notes)
        fatal = pre.get("problem")
        print(preflight_line(pre, ctx["mode"], ctx["note"], ctx["mps"].note), file=sys.stderr, flush=True)
        for i, spec in enumerate([] if fatal else args.specs):
            run = _start(spec, len(args.specs) - i, ends, args, ctx, work, runs, nl)
            if run.error and ctx["mps"].on and not any(r.results or r.ddp for r in runs):
                _mps_off_after(run, ctx, work, notes)   # nothing has worked under MPS: this variant again without
                runs.pop()
                _start(spec, len(args.specs) - i, ends, args, ctx, work, runs, nl)
    except Interrupted as e:
        notes.append(f"interrupted by {e}: the report covers what finished before")
    except (RuntimeError, OSError) as e:
        fatal = str(e)
    finally:
        signal.alarm(0)
        mps_note = None
        try:
            with procs.cleanup():
                mps_note = procs.stop_mps(ctx["mps"])
                teardown_network(args, ctx["mode"], ctx["tag"], ctx["shaped"])
        except Interrupted as e:
            notes.append(f"interrupted by {e} while stopping: the report covers what finished before")
        if mps_note:
            notes.append(mps_note)
    try:
        with procs.cleanup():   # a signal now waits for the report and the archive
            text, doc, code = finish(args, pre, ctx, runs, notes, fatal, nl)
            try:
                write_outputs(args.out, work, text, doc)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except Interrupted:
        pass
    finally:
        procs.take_pending()
        for s, h in old.items():
            signal.signal(s, h)
    print(text)
    print(f"\nwritten: {args.out}/report.txt, report.json, logs.tar.gz", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1))
    return code


def finish(args, pre, ctx, runs, notes, fatal, nl):
    first = next((r for r in runs if r.nccl), None)
    nccl, torch = (first.nccl, first.torch) if first else (pre.get("nccl", "?"), pre.get("torch", "?"))
    header = (f"NCCL {nccl} (torch {torch}), {args.ranks} ranks, {ctx['note']}, links "
              f"{args.rate if ctx['shaped'] else 'unshaped'}, MPS {ctx['mps'].note.split(' (')[0]}")
    lines = [preflight_line(pre, ctx["mode"], ctx["note"], ctx["mps"].note)]
    if args.extra_env:
        lines.append("--nccl-env: " + " ".join(f"{k}={v}" for k, v in args.extra_env.items()))
    lines += [f"note: {n}" for n in notes]
    if fatal:
        lines += ["", f"ERROR: {fatal}"]
        return "\n".join(lines), report_doc(args, pre, ctx, runs, 2, [fatal], notes), 2
    lines += [report.format_evidence(runs, nl), "", report.format_report(runs, nl, header), report.format_stats(runs),
              report.format_ddp(runs), report.format_targets(report.targets(runs))]
    code, problems = report.verdict(runs, nl, args.variant_list)
    lines.append("\n" + ("PASS: NCCL loaded the plugin and ran CollNet where asked; every element right" if code == 0
                         else "FAIL:\n  " + "\n  ".join(problems)))
    return "\n".join(lines), report_doc(args, pre, ctx, runs, code, problems, notes), code


if __name__ == "__main__":
    sys.exit(main())
