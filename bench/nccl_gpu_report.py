"""The GPU proof's verdict and report (pure: runs in, text and numbers out).

Used by bench/nccl_gpu.py; unit-tested in tests/unit/test_nccl_gpu_plan.py. `nl` is
clustertool.plugin.nccl_log (loaded by nccl_gpu_plan.load_nccl_log).
"""

from __future__ import annotations

import re
import statistics

from nccl_gpu_plan import VariantRun, parse_rate

REFERENCE = "reference only (unpaced)"


def _fmt_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _bytes_per_s(pace: str) -> float:
    return (parse_rate(pace) or 0) / 8


# ---------------- verdict ----------------
def _plugin_problems(run: VariantRun, nl) -> list[str]:
    spec = run.spec
    assert spec is not None
    if not spec.plugin:
        nets = {log.network for log in run.logs}
        return [] if nets == {"Socket"} else [
            f"{run.name}: NCCL ran on {', '.join(sorted(map(str, nets)))}, not its Socket transport"]
    if not all(nl.plugin_loaded(log) for log in run.logs):
        bad = next(log for log in run.logs if not nl.plugin_loaded(log))
        why = bad.no_plugin or f"Using network {bad.network}"
        return [f"{run.name}: NCCL did not load the clustertool plugin ({why})"]
    if not spec.collnet:
        return []
    off = [why for on, why in (nl.collnet_state(log) for log in run.logs) if not on]
    if off:
        return [f"{run.name}: NCCL did not run CollNet: {off[0]}"]
    if not nl.ran_collnet(run.logs):
        return [f"{run.name}: CollNet was set up but no allreduce ran on it"]
    ran = {log.plugin_algorithm for log in run.logs if log.plugin_algorithm}
    if spec.servers and ran != {"servers"}:
        why = next((w for log in run.logs for w in log.warnings if "reduc" in w.lower() or "REDUCERS" in w), None)
        what = f"ran {', '.join(sorted(ran))}" if ran else "logged no CollNet algorithm"
        return [f"{run.name}: the plugin {what}, not the reduction servers" + (f" ({why})" if why else "")]
    return []


def verdict(runs: list[VariantRun], nl, asked: list[str] | None = None) -> tuple[int, list[str]]:
    """(exit code, problems): every variant asked for ran, the plugin is NCCL's net where asked,
    CollNet (and the reduction servers) ran where asked, every element is right, and the training
    step ended with the same parameters on every rank."""
    ran = {run.name for run in runs}
    problems = [f"{name}: not run (the budget or an interrupt ended the proof first)"
                for name in (asked or []) if name not in ran]
    for run in runs:
        done = run.ddp is not None if run.spec and run.spec.ddp else bool(run.results)
        if not done and not run.error:
            problems.append(f"{run.name}: no {'training step' if run.spec and run.spec.ddp else 'allreduce'} finished")
        if run.error:
            problems.append(f"{run.name}: {run.error}")
        wrong = sum(r["wrong"] for r in run.results)
        if wrong:
            problems.append(f"{run.name}: {wrong} wrong elements against the CPU reference")
        if run.ddp is not None and not run.ddp.get("same_params"):
            problems.append(f"{run.name}: the ranks ended training with different parameters (the gradient allreduce "
                            "gave ranks different sums)")
        if run.logs and not run.error:   # a failed run's logs stop early: the error is the finding
            problems += _plugin_problems(run, nl)
    return (1 if problems else 0), problems


# ---------------- tables ----------------
def format_report(runs: list[VariantRun], nl, header: str) -> str:
    """Every size of every allreduce variant, then busbw side by side: the unpaced pass with its
    ratios to Socket, and each paced pass with busbw/B (B: the pace in bytes/s)."""
    width = max([16] + [len(r.name) for r in runs])
    lines = [header, "", f"{'variant':<{width}} {'size':>6} {'time(us)':>11} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
             f"{'#wrong':>7}  algorithm/protocol (NCCL's choice)"]
    for run in runs:
        if run.spec and run.spec.ddp:
            continue
        choice = nl.algos_by_size(run.logs) if run.logs else {}
        for r in run.results:
            algo = "/".join(choice.get(r["size"], ("-", "-")))
            short = f"  ({r['iters']} of the asked iterations: the share ended)" if r.get("short") else ""
            lines.append(f"{run.name:<{width}} {_fmt_size(r['size']):>6} {r['time_us']:>11.1f} {r['algbw']:>11.3f} "
                         f"{r['busbw']:>11.3f} {r['wrong']:>7}  {algo}{short}")
        if run.stopped_before:
            lines.append(f"{run.name:<{width}} stopped before {_fmt_size(run.stopped_before)}: the next size would "
                         f"not end inside its {run.share_s:.0f} s share of --budget")
        if run.error:
            lines.append(f"{run.name:<{width}} failed: {run.error}")
    return "\n".join(lines + _unpaced_table(runs) + _paced_tables(runs))


def _busbw(run: VariantRun) -> dict[int, float]:
    return {r["size"]: r["busbw"] for r in run.results}


def _unpaced_table(runs: list[VariantRun]) -> list[str]:
    plain = [r for r in runs if r.spec and not r.spec.ddp and not r.spec.pace]
    if not plain:
        return []
    names = [r.name for r in plain]
    ratios = [(f"{n.split('-')[-1]}/socket", n) for n in ("net", "collnet-sharded", "collnet-ring", "collnet-servers")
              if n in names and "socket" in names]
    lines = ["", "busbw (GB/s) side by side, unpaced", f"{'size':>6} " + " ".join(f"{n:>16}" for n in names)
             + "".join(f"  {label:>15}" for label, _ in ratios)]
    bw = {r.name: _busbw(r) for r in plain}
    for s in sorted({s for b in bw.values() for s in b}):
        row = f"{_fmt_size(s):>6} " + " ".join(f"{bw[n][s]:>16.3f}" if s in bw[n] else f"{'-':>16}" for n in names)
        for _, n in ratios:
            a, b = bw["socket"].get(s), bw[n].get(s)
            row += f"  {b / a:>14.2f}x" if a and b else f"  {'-':>15}"
        lines.append(row)
    return lines


def _paced_tables(runs: list[VariantRun]) -> list[str]:
    lines: list[str] = []
    socket = next((r for r in runs if r.name == "socket"), None)
    for pace in sorted({r.spec.pace for r in runs if r.spec and r.spec.pace and not r.spec.ddp}):
        group = [r for r in runs if r.spec and r.spec.pace == pace and not r.spec.ddp]
        b = _bytes_per_s(pace)
        names = [r.spec.base for r in group if r.spec]
        bw = {r.spec.base: _busbw(r) for r in group if r.spec}
        ratio = "net" in names and "collnet-servers" in names
        lines += ["", f"paced at {pace}: every plugin rank and reducer through one token bucket per process and "
                      f"direction, B = {b / 1e6:.1f} MB/s; busbw in GB/s and as a multiple of B"
                      + (f"; socket is {REFERENCE}" if socket else ""),
                  f"{'size':>6} " + " ".join(f"{n:>16} {'/B':>6}" for n in names)
                  + ("  servers/net" if ratio else "") + (f"  {'socket (ref)':>12}" if socket else "")]
        for s in sorted({s for v in bw.values() for s in v}):
            row = f"{_fmt_size(s):>6} " + " ".join(
                f"{bw[n][s]:>16.3f} {bw[n][s] * 1e9 / b:>6.2f}" if s in bw[n] else f"{'-':>16} {'-':>6}" for n in names)
            if ratio:
                a, c = bw["net"].get(s), bw["collnet-servers"].get(s)
                row += f"  {c / a:>10.2f}x" if a and c else f"  {'-':>11}"
            if socket:
                ref = _busbw(socket).get(s)
                row += f"  {ref:>12.3f}" if ref else f"  {'-':>12}"
            lines.append(row)
        limit = max((v * 1e9 / b for n in names for v in bw[n].values()), default=0)
        world = max((r.results[0].get("world", 0) for r in group if r.results), default=0)
        if world and limit > 1.1 * 2 * (world - 1) / world:
            lines.append(f"  NOTE: busbw {limit:.1f}x B is above what any allreduce can reach through links of B "
                         f"({2 * (world - 1) / world:.2f}x for {world} ranks): the plugin did not pace (a build "
                         "that does not read CLUSTERTOOL_LINK_RATE?)")
    return lines


def stats_rows(run: VariantRun) -> dict | None:
    """One variant's CollNet stats over its ranks' communicators that carried requests."""
    rows = [s for s in run.stats if s.get("requests")]
    if not rows:
        return None
    reqs = sum(s["requests"] for s in rows)
    ranks = len({s.get("rank") for s in rows}) or 1

    def num(key: str) -> list[float]:
        return [float(s[key]) for s in rows if isinstance(s.get(key), (int, float))]

    def weighted(key: str) -> float | None:
        pairs = [(float(s[key]), s["requests"]) for s in rows if isinstance(s.get(key), (int, float))]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None

    total = sum(num("bytes"))
    return {"variant": run.name, "algo": next((s.get("algo") for s in rows if s.get("algo")), "-"),
            "window": max(num("window"), default=None), "requests_per_rank": reqs / ranks,
            "mean_bytes": total / reqs if total else weighted("mean_bytes"),
            "inflight_mean": weighted("inflight_mean"), "inflight_max": max(num("inflight_max"), default=None),
            "p50_us": statistics.median(num("post_to_done_p50_us")) if num("post_to_done_p50_us") else None,
            "p99_us": max(num("post_to_done_p99_us"), default=None), "test_p99_us": max(num("test_p99_us"),
                                                                                        default=None)}


def _n(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def format_stats(runs: list[VariantRun]) -> str:
    coll = [r for r in runs if r.spec and r.spec.collnet]
    if not coll:
        return ""
    width = max(len(r.name) for r in coll)
    lines = ["", "CollNet stats (CLUSTERTOOL_COLLNET_STATS, per communicator at close; over the ranks: requests per "
                 "rank, in flight weighted by requests, p50 the median rank, p99 the worst)",
             f"{'variant':<{width}} {'algo':>8} {'window':>6} {'requests':>9} {'mean size':>10} {'inflight':>9} "
             f"{'max':>4} {'p50(us)':>9} {'p99(us)':>9} {'test p99':>9}"]
    for run in coll:
        s = stats_rows(run)
        if s is None:
            lines.append(f"{run.name:<{width}} no stats (a plugin build that writes none, or no CollNet request)")
            continue
        size = _fmt_size(int(s["mean_bytes"])) if s["mean_bytes"] and float(s["mean_bytes"]).is_integer() else \
            _n(s["mean_bytes"], ".0f")
        lines.append(f"{run.name:<{width}} {s['algo']:>8} {_n(s['window'], '.0f'):>6} {s['requests_per_rank']:>9.0f} "
                     f"{size:>10} {_n(s['inflight_mean'], '.2f'):>9} {_n(s['inflight_max'], '.0f'):>4} "
                     f"{_n(s['p50_us'], '.0f'):>9} {_n(s['p99_us'], '.0f'):>9} {_n(s['test_p99_us'], '.1f'):>9}")
    return "\n".join(lines)


def _ddp_ratio(run: VariantRun, runs: list[VariantRun]) -> float | None:
    net = next((r for r in runs if r.spec and r.spec.ddp and r.spec.base == "net" and run.spec
                and r.spec.pace == run.spec.pace), None)
    if net is None or not net.ddp or not run.ddp:
        return None
    return run.ddp["samples_per_s"] / net.ddp["samples_per_s"]


def format_ddp(runs: list[VariantRun]) -> str:
    ddp = [r for r in runs if r.spec and r.spec.ddp]
    if not ddp:
        return ""
    first = next((r.ddp for r in ddp if r.ddp), None) or {}
    width = max([16] + [len(r.name) for r in ddp])
    lines = ["", f"training step: torch DDP (backend nccl), an MLP of {first.get('params', 0) / 1e6:.1f}M "
                 f"{first.get('dtype', 'float32')} parameters, batch {first.get('batch', '?')} per rank, samples/s "
                 "of all ranks over the timed steps (the slowest rank)",
             f"{'variant':<{width}} {'pace':>26} {'steps':>6} {'samples/s':>10} {'step(ms)':>9} {'loss':>17} "
             f"{'vs ddp-net':>10}"]
    for run in ddp:
        pace = (run.spec.pace if run.spec and run.spec.pace else
                (REFERENCE if run.spec and not run.spec.plugin else "unpaced"))
        if not run.ddp:
            lines.append(f"{run.name:<{width}} {pace:>26}  no result: {run.error or 'no step finished'}")
            continue
        d, ratio = run.ddp, _ddp_ratio(run, runs)
        loss = f"{d.get('loss_first', 0):.4g}->{d.get('loss_last', 0):.4g}"
        lines.append(f"{run.name:<{width}} {pace:>26} {d['steps']:>6} {d['samples_per_s']:>10.1f} "
                     f"{1e3 * d['seconds'] / max(d['steps'], 1):>9.1f} {loss:>17} "
                     f"{(f'{ratio:.2f}x' if ratio and run.spec and run.spec.base != 'net' else '-'):>10}")
    return "\n".join(lines)


# ---------------- issue 31's targets ----------------
def _at(run: VariantRun | None, size: int) -> tuple[float | None, int | None]:
    """busbw at `size`, else at the largest size measured (and which size that was)."""
    if run is None or not run.results:
        return None, None
    bw = _busbw(run)
    use = size if size in bw else max(bw)
    return bw[use], use


def targets(runs: list[VariantRun]) -> list[dict]:
    """Issue 31's GPU targets, measured where the variants ran (informational: the exit code is about
    correctness, not speed)."""
    def find(base: str, paced: bool, ddp: bool = False) -> VariantRun | None:
        return next((r for r in runs if r.spec and r.spec.base == base and bool(r.spec.pace) == paced
                     and r.spec.ddp == ddp), None)

    out: list[dict] = []

    def add(what: str, value: float | None, goal: float, unit: str = "x", size: int | None = None,
            want: int | None = None) -> None:
        where = f" (at {_fmt_size(size)})" if size and want and size != want else ""
        out.append({"target": what + where, "value": value, "goal": goal, "unit": unit,
                    "met": None if value is None else value >= goal})

    sock, shard = find("socket", False), find("collnet-sharded", False)
    for size, goal in ((16 << 20, 1.0), (32 << 20, 0.9), (64 << 20, 0.9)):
        a, _ = _at(sock, size)
        b, got = _at(shard, size)
        add(f"unpaced: CollNet sharded / Socket busbw at {_fmt_size(size)}", b / a if a and b and got == size else None,
            goal)
    s = stats_rows(shard) if shard else None
    add("unpaced: CollNet sharded requests in flight (mean)", s and s["inflight_mean"], 4.0, "")
    paced = [r for r in runs if r.spec and r.spec.pace and not r.spec.ddp]
    pace = paced[0].spec.pace if paced and paced[0].spec else None
    b = _bytes_per_s(pace) if pace else 0
    net, pshard, serv = find("net", True), find("collnet-sharded", True), find("collnet-servers", True)
    for run, label, goal in ((net, "plugin net", 0.9), (pshard, "CollNet sharded", 0.9), (serv, "servers", 1.35)):
        v, got = _at(run, 64 << 20)
        add(f"paced {pace or '-'}: {label} busbw / B at 64M", v * 1e9 / b if v and b else None, goal, "B", got,
            64 << 20)
    v1, g1 = _at(serv, 64 << 20)
    v2, g2 = _at(net, 64 << 20)
    add(f"paced {pace or '-'}: servers / plugin net busbw at 64M", v1 / v2 if v1 and v2 and g1 == g2 else None, 1.35,
        "x", g1, 64 << 20)
    dserv = find("collnet-servers", True, ddp=True)
    add("training step: samples/s servers / plugin net (same pace)", _ddp_ratio(dserv, runs) if dserv else None, 1.2)
    return out


def format_targets(items: list[dict]) -> str:
    lines = ["", "issue 31 targets (measured here; informational, the exit code is about correctness)"]
    for t in items:
        value = "not measured" if t["value"] is None else f"{t['value']:.2f}{t['unit']}"
        state = "-" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"  {t['target']:<66} {value:>14}   >= {t['goal']:.2f}{t['unit']:<2} {state}")
    return "\n".join(lines)


# ---------------- evidence ----------------
_R_LISTEN = re.compile(r"clustertool-reducer: listening on (\S+)")
_R_START = re.compile(r"clustertool-reducer: session \S+ start: (\d+) ranks")
_R_END = re.compile(r"clustertool-reducer: session \S+ end: \d+ ranks, (\d+) reductions, (\d+) bytes")
_R_ERROR = re.compile(r"clustertool-reducer: (session \S+ error: .*)")


def reducer_summary(i: int, text: str) -> str:
    """One line per reducer from its stderr: where it listened, its sessions (one per CollNet
    communicator), what they reduced, and the first error."""
    where = _R_LISTEN.search(text)
    starts, ends, errors = _R_START.findall(text), _R_END.findall(text), _R_ERROR.findall(text)
    refused = text.count("refused connection")
    line = (f"reducer {i} ({where.group(1) if where else 'never listened'}): {len(starts)} session(s), "
            f"{len(ends)} ended, {sum(int(r) for r, _ in ends)} reductions, "
            f"{sum(int(b) for _, b in ends) / 1e6:.1f} MB")
    if refused:
        line += f", {refused} connection(s) refused"
    return line + (f"; first error: {errors[0][:200]}" if errors else "")


def format_evidence(runs: list[VariantRun], nl, limit: int = 16) -> str:
    lines = ["", "What NCCL's logs say (rank 0, and the reason where a rank differs)"]
    for run in runs:
        if not run.logs:
            continue
        log = run.logs[0]
        on, why = nl.collnet_state(log)
        algo = f"; plugin algorithm {log.plugin_algorithm}" if log.plugin_algorithm else ""
        lines.append(f"[{run.name}] NCCL {log.version or '?'}; network {log.network or '?'}; net plugin "
                     f"{log.net_plugin or '-'} (v{log.net_abi or '?'}); CollNet plugin {log.collnet_plugin or '-'} "
                     f"(v{log.collnet_abi or '?'}); tuner {log.tuner_plugin or '-'}; CollNet "
                     f"{'on' if on else 'off'}: {why}{algo}")
        for text in nl.key_lines(run.texts[0], limit=limit):
            lines.append(f"    {text}")
        lines += [f"    {reducer_summary(i, text)}" for i, text in enumerate(run.reducer_texts)]
    return "\n".join(lines)
