"""`clustertool doctor`: find what is wrong with a cluster (and fix the safe things)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session

if TYPE_CHECKING:  # a fast --help: the doctor loads in the command
    from clustertool.doctor.findings import AutoCordon


def doctor(
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
    fix: bool = typer.Option(
        False, "--fix", help="Do the safe fixes (kill strays, clear finished jobs' logs, re-push known_hosts), then "
                             "check again."),
    check: List[str] = typer.Option(
        [], "--check", help="Run only these checks (repeat, or comma-separated): reach, ssh-mesh (or mesh), "
                            "disk, sameness, strays, clock, mpi-smoke, network (or links: bandwidth and latency in "
                            "rounds of pairs, as --bisect), plugin-nccl (NCCL with the plugin; GPU clusters only), gpu "
                            "(nvidia-smi: GPU count, ECC, row remapping, clock slowdowns, PCIe link, persistence; Xid "
                            "events of the kernel log), efa (fi_info against the EFA interfaces; the network NCCL "
                            "used), shared-fs (each --shared-fs mounted, the same and writable on every node; "
                            "write/read time)."),
    skip: List[str] = typer.Option([], "--skip", help="Skip these checks (repeat, or comma-separated), "
                                                      "e.g. --skip network."),
    plugin_path: Optional[str] = typer.Option(
        None, "--plugin-path", help="Where the NCCL plugin is deployed on the nodes (for its checksum)."),
    disk_path: List[str] = typer.Option(
        [], "--disk-path", help="Folders whose free space to check besides home and the job logs (default /scratch)."),
    cordon: bool = typer.Option(
        False, "--cordon", help="Cordon every node found at error severity (not the leader; a finding about the "
                                "link between two nodes cordons neither), the finding as the reason; "
                                "`clustertool uncordon NODE` puts one back."),
    bisect: bool = typer.Option(
        False, "--bisect", help="Find the slow node or link, alone (the network check): rounds of disjoint pairs, "
                                "all pairs of a round at once, each measuring iperf3 bandwidth and TCP round trips; "
                                "the ends of a slow pair are paired next with nodes known good. A node slow with "
                                "every partner is named, else the link. At most ceil(log2(n))+1 rounds, not n-1; "
                                "--json lists every measurement."),
    threshold: float = typer.Option(
        0.8, "--threshold", help="Network: a pair is slow below this fraction of the cluster's median bandwidth "
                                 "(and below the expected link rate, where the cluster declares one), or with a round "
                                 "trip above the median divided by it (and 1 ms more)."),
    all_pairs: bool = typer.Option(
        False, "--all-pairs", help="Network / --bisect: measure every pair (n-1 rounds) instead of searching: every "
                                   "link covered, time grows with n."),
    deep: bool = typer.Option(
        False, "--deep", help="GPU: also run DCGM's diagnostics (`dcgmi diag -r 2`, about two minutes; the level "
                              "with --deep-level) on every GPU node that has DCGM, when no job runs."),
    deep_level: int = typer.Option(2, "--deep-level", help="DCGM diag level for --deep: 1 (seconds) or 2 (minutes)."),
    deep_timeout: float = typer.Option(
        600.0, "--deep-timeout", help="Seconds DCGM's diag may take on a node; one that runs longer is stopped and "
                                      "reported as timed out (doctor never waits longer)."),
    gpu_timeout: float = typer.Option(
        60.0, "--gpu-timeout", help="Seconds each nvidia-smi or kernel-log read may take on a node before it is "
                                    "stopped and reported (a hung nvidia-smi is itself a finding)."),
    since: Optional[str] = typer.Option(
        None, "--since", help="GPU: read Xid events of the kernel log since this age or time (30m, 2h, 3d, "
                              "'2026-11-26 10:00'; journalctl); default since boot."),
    nccl_log: Optional[str] = typer.Option(
        None, "--nccl-log", help="EFA: read which network NCCL used from this job's output (id or name; run with "
                                 "-x NCCL_DEBUG=INFO) or a log file here; default the newest `plugin check`."),
) -> None:
    """Check SSH mesh, disks, sameness, stray processes, clocks, an MPI smoke test, the network (bandwidth and
    latency in rounds of pairs; --bisect alone), on GPU clusters with the plugin deployed whether NCCL
    uses it (`plugin check`), GPU health (nvidia-smi, Xid events; DCGM with --deep) and EFA."""
    from clustertool.cli import render
    from clustertool.doctor.checkup import run
    from clustertool.doctor.doctorrequests import DoctorRequest

    request = DoctorRequest.of(check, skip, bisect=bisect, fix=fix, cordon=cordon, plugin_path=plugin_path,
                               disk_paths=disk_path, threshold=threshold, all_pairs=all_pairs,
                               deep=deep_level if deep else 0, since=since, gpu_timeout=gpu_timeout,
                               deep_timeout=deep_timeout, nccl_log=nccl_log)
    result = run(open_session(cluster, json_output), request)
    cordoned = result.cordoned
    if json_output:
        check_dicts = [{**render.to_jsonable(c), "status": c.status} for c in result.checks]
        render.print_json({"cluster": result.cluster, "clean": result.clean, "fixed": result.fixed,
                           "checks": check_dicts, **({"cordon": cordoned.to_dict()} if cordoned is not None else {})})
        raise typer.Exit(result.exit_code)
    for line in result.fixed:
        typer.echo(f"fixed: {line}")
    for c in result.checks:
        mark = {"ok": "ok  ", "warning": "WARN", "error": "FAIL", "skipped": "skip"}[c.status]
        extra = f" ({c.skipped})" if c.skipped else ""
        summary = f"  {c.data['summary']}" if "summary" in c.data else ""
        typer.echo(f"[{mark}] {c.name}{extra}  {c.seconds:.1f}s{summary}")
        if bisect and "measurements" in c.data:
            _show_rounds(c.data)
    for f in result.findings:
        typer.echo(f"{f.severity.upper():7} {f.check} {f.node or f.data.get('link') or 'cluster'}: {f.message}")
        if f.fix:
            typer.echo(f"        fix: {f.fix}")
    if cordoned is not None:
        _show_cordon(cordoned)
    if result.clean:
        typer.echo(f"cluster {result.cluster}: clean")
    else:
        n = sum(1 for f in result.findings if f.problem)
        can_fix = any(f.fixable for f in result.findings)
        sys.stderr.write(f"cluster {result.cluster}: {n} problem(s)"
                         + ("; `clustertool doctor --fix` can fix some\n" if can_fix else "\n"))
    raise typer.Exit(result.exit_code)


def _show_cordon(done: AutoCordon) -> None:
    """What `doctor --cordon` did, one line per node."""
    for node, why in done.cordoned.items():
        typer.echo(f"cordoned {node}: {why}")
    for node in done.already:
        typer.echo(f"{node}: already cordoned")
    for item in done.skipped:
        typer.echo(f"not cordoned {item['node']}: {item['why']}")
    if done.cordoned:
        typer.echo(f"hostfile {done.hostfile} written; the leader's ~/hostfile: {done.leader_hostfile}")
        if done.slurm:
            typer.echo(f"slurm: {done.slurm}")
    elif not done.already and not done.skipped:
        typer.echo("cordoned nothing: no node has an error of its own")


def _show_rounds(data: dict) -> None:
    """`doctor --bisect`: each round's pairs, the slow ones spelled out."""
    median, threshold = data.get("median_bits_per_s") or 0.0, data["threshold"]
    rounds: dict[int, list[dict]] = {}
    for m in data["measurements"]:
        rounds.setdefault(m["round"], []).append(m)
    for r, ms in sorted(rounds.items()):
        slow = [f"{m['a']}<->{m['b']} " + (f"{m['bits_per_s'] / 1e6:.0f} Mbit/s" if m["bits_per_s"] is not None
                                           else f"failed: {m['error']}")
                for m in ms if (m["bits_per_s"] or 0.0) < threshold * median]
        typer.echo(f"    round {r}: {len(ms)} pair(s)" + (f"; below {threshold:.0%} of the median: {', '.join(slow)}"
                                                           if slow else ""))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
