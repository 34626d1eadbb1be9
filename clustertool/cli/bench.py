"""`clustertool bench scaling|allreduce`: benchmarks across the cluster."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import typer

from clustertool.cli.common import ClusterOpt, open_session

if TYPE_CHECKING:  # a fast --help
    from clustertool.core.model import ClusterRecord

# options `bench scaling` and `bench compare` share (both run a user's job and read its throughput)
PerNodeOpt = typer.Option(None, "--per-node", help="Ranks per node (default: the nodes' slots).")
MetricRegexOpt = typer.Option(None, "--metric-regex", help="Regex with one group around the throughput number "
                                                           "(default: images/sec, samples/sec, img/sec ... figures).")
RankEnvOpt = typer.Option([], "-x", "--env", help="VAR or VAR=VALUE exported to every rank (repeatable).")
LauncherOpt = typer.Option(None, "--launcher", metavar="NAME",
                           help="What starts the ranks, as `run --launcher`: mpirun (default), torchrun, accelerate, "
                                "deepspeed or process (a command starting with one of them gets it by itself).")

bench_app = typer.Typer(name="bench", no_args_is_help=True, add_completion=False,
                        help="Benchmarks across the cluster: scaling of a training job, allreduce bandwidth.")


@bench_app.command("scaling", context_settings={"allow_interspersed_args": False})
def scaling(
    command: List[str] = typer.Argument(
        ..., metavar="-- COMMAND...",
        help="The job, after --: run by mpirun at each size. One argument is split like a shell line."),
    nodes: str = typer.Option(
        "1,2,4", "--nodes", "-N", help="Cluster sizes to run at, e.g. 1,2,4 (first N nodes, leader first)."),
    per_node: Optional[int] = PerNodeOpt,
    metric_regex: Optional[str] = MetricRegexOpt,
    env: List[str] = RankEnvOpt,
    launcher_name: Optional[str] = LauncherOpt,
    timeout: float = typer.Option(1800, "--timeout", help="Seconds per size before the run counts as hung."),
    repeat: int = typer.Option(
        1, "--repeat", "-r", help="Runs per size, round-robin over the sizes; the median counts (for noisy, shared "
                                  "machines)."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", metavar="PATH", help="Write the table as CSV here."),
    json_path: Optional[Path] = typer.Option(None, "--json-file", metavar="PATH",
                                             help="Write the result as JSON here."),
    chart: Optional[Path] = typer.Option(
        None, "--chart", metavar="PATH", help="Write a PNG chart (throughput and efficiency vs ranks) here."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", metavar="DIR", help="Keep each size's full output here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream the job's output."),
    json_output: bool = typer.Option(
        False, "--json", help="Print the result as JSON on stdout (instead of the table and the job's output)."),
    plugin: bool = typer.Option(
        False, "--plugin", help="Run with the deployed NCCL plugin's environment (as `run --plugin`)."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Run the same job at several cluster sizes and report throughput, speedup and scaling efficiency.

    Each size runs `mpirun -np N*K -H leader:K,node-2:K,... COMMAND` on the leader. Throughput is
    parsed from the output: the last "total ... images/sec" line, else the sum over rank-tagged
    lines, else the last "samples/sec: N"-like figure. Efficiency = speedup / (ranks / base ranks).
    Exit code 1 if any size failed or printed no figure.
    """
    from clustertool.bench.benchjobs import launcher
    from clustertool.bench.scaling import parse_sizes, run_scaling
    from clustertool.cli import render

    sizes = parse_sizes(nodes)
    session = open_session(cluster)
    c = session.record
    _warn_shared_cpus(c, sizes, per_node)
    on_line = None if (quiet or json_output) else render.live_line
    launch = launcher(session, env=env, timeout=timeout, on_line=on_line, plugin=plugin, launcher_name=launcher_name)
    result = run_scaling(c, sizes, per_node, command, launch=launch, regex=metric_regex,
                              log_dir=log_dir, repeat=repeat, report=render.info)
    from clustertool.bench.chart import write_chart

    _finish("scaling", result, f"scaling on {c.name}: {result.command}", json_output, csv_path, json_path, chart,
            write_chart)


@bench_app.command("compare", context_settings={"allow_interspersed_args": False})
def compare(
    command: List[str] = typer.Argument(
        ..., metavar="-- COMMAND...",
        help="The job, after --, with {} where the variant goes, e.g. python train_mlp.py --allreduce {}."),
    variants: str = typer.Option(..., "--variants", "-V", help="Comma list of variants, the first the baseline, "
                                                               "e.g. mpi,sharded,servers."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Run on the first N worker nodes (default: all)."),
    per_node: Optional[int] = PerNodeOpt,
    metric_regex: Optional[str] = MetricRegexOpt,
    env: List[str] = RankEnvOpt,
    launcher_name: Optional[str] = LauncherOpt,
    timeout: float = typer.Option(1800, "--timeout", help="Seconds per run before it counts as hung."),
    repeat: int = typer.Option(1, "--repeat", "-r", help="Runs per variant, round-robin; the median counts."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", metavar="PATH", help="Write the table as CSV here."),
    json_path: Optional[Path] = typer.Option(None, "--json-file", metavar="PATH",
                                             help="Write the result as JSON here."),
    chart: Optional[Path] = typer.Option(None, "--chart", metavar="PATH",
                                         help="Write a PNG bar chart (throughput per variant) here."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", metavar="DIR", help="Keep each run's output here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream the job's output."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    plugin: bool = typer.Option(
        False, "--plugin", help="Run with the deployed plugin's environment and the cluster's reduction servers "
                                "(as `run --plugin`)."),
    watch: bool = typer.Option(
        False, "--watch", help="The variants are the cost of watching, not words of the command (no {}): off (no "
                               "monitoring, run --no-record), record (the recorder every job starts), monitoring "
                               "(`monitoring enable` too); switched before each run, put back at the end."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Run the same job under several variants side by side and compare their throughput.

    Each variant is COMMAND with {} replaced by its name, run on the same nodes; with --repeat the
    variants take turns. Exit code 1 if any variant failed or printed no figure.
    """
    from clustertool.bench.benchjobs import launcher
    from clustertool.bench.compare import parse_variants, run_compare, write_chart
    from clustertool.bench.watchvariants import WatchSwitch, check
    from clustertool.cli import render

    names = parse_variants(variants)
    if watch:
        check(names)
    session = open_session(cluster)
    c = session.record
    switch = WatchSwitch(session, render.info) if watch else None
    on_line = None if (quiet or json_output) else render.live_line
    launch = launcher(session, env=env, timeout=timeout, on_line=on_line, plugin=plugin, launcher_name=launcher_name,
                      record=(lambda: switch.record) if switch else None)
    try:
        result = run_compare(c, names, command, launch=launch, nodes=nodes, per_node=per_node, regex=metric_regex,
                             repeat=repeat, log_dir=log_dir, report=render.info, before=switch)
    finally:
        if switch is not None:
            switch.restore()
    _finish("compare", result, f"{', '.join(names)} on {c.name} ({result.nodes} nodes): {result.command}", json_output,
            csv_path, json_path, chart, write_chart)


def _finish(kind: str, result: Any, title: str, json_output: bool, csv_path: Path | None, json_path: Path | None,
            chart: Path | None, write_chart: Callable[[Any, Path], Path]) -> None:
    """Print a bench result (table, or JSON on stdout), write its CSV/JSON/chart files, exit 0 or 1.
    ``kind``: the bench (scaling or compare) whose module's COLUMNS, rows, to_csv and to_json fit."""
    from clustertool.cli import render

    bench: Any = importlib.import_module(f"clustertool.bench.{kind}")
    if json_output:
        sys.stdout.write(bench.to_json(result) + "\n")
    else:
        render.table(bench.COLUMNS, bench.rows(result), title=title)
    for path, text in ((csv_path, bench.to_csv), (json_path, bench.to_json)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text(result))
            render.info(f"wrote {path}")
    if chart is not None:
        render.info(f"chart: {write_chart(result, chart)}")
    raise typer.Exit(0 if result.ok else 1)


def _warn_shared_cpus(cluster: ClusterRecord, sizes: list[int], per_node: int | None) -> None:
    """Local nodes share this machine's CPUs: past that many ranks, throughput cannot grow."""
    import os

    from clustertool.cli import render

    ranks = max(sizes) * (per_node or 1)
    cpus = os.cpu_count() or 1
    if cluster.provider == "local" and ranks > cpus:
        render.info(f"note: local nodes share this machine's {cpus} CPU(s); at {ranks} ranks they compete "
                    f"for them, so scaling past {cpus} rank(s) measures the CPU limit, not the network")


@bench_app.command("allreduce")
def allreduce(
    sizes: str = typer.Option("1M:256M", "--sizes", help="MIN:MAX message sizes in bytes (K/M/G), doubling."),
    algo: str = typer.Option("sharded,ring,mpi", "--algo", help="Comma list of servers (the cluster's reduction "
                             "servers), sharded, ring (the plugin's) and mpi (Open MPI's MPI_Allreduce on the same "
                             "ranks)."),
    dtype: str = typer.Option("float", "--dtype", help="float, half, bfloat16, double, int32, int64, ..."),
    op: str = typer.Option("sum", "--op", help="sum, prod, min or max."),
    iters: int = typer.Option(5, "--iters", "-n", help="Timed iterations per size."),
    warmup: int = typer.Option(1, "--warmup", "-w", help="Untimed iterations per size."),
    ifname: Optional[str] = typer.Option(
        None, "--ifname", help="Interface the plugin binds to (default: first non-loopback)."),
    env: List[str] = typer.Option(
        [], "-x", "--env", help="VAR or VAR=VALUE for every rank, e.g. CLUSTERTOOL_SOCKS_PER_PEER=2."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds before the run counts as hung."),
    tuner_csv: Optional[Path] = typer.Option(None, "--tuner-csv", help="Write a tuner table from the results here "
                                             "(CollNet where the plugin won); deploy it with `plugin deploy "
                                             "--tuner-table`."),
    request_size: str = typer.Option("256K", "--request", help="Each allreduce goes to the plugin as NCCL's CollNet "
                                     "proxy sends it: requests of this many bytes (K/M/G) ..."),
    depth: int = typer.Option(8, "--depth", help="... at most this many outstanding (NCCL_STEPS), the oldest "
                              "tested first."),
    one_request: bool = typer.Option(False, "--one-request", help="Post each allreduce as one request instead "
                                     "(the plugin's own best case, not what NCCL sends)."),
    json_output: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream collnet_bench's output."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Run collnet_bench on every node (one rank per node) and print the all_reduce_perf table.

    busbw = algbw * 2(n-1)/n; #wrong counts elements that differ from MPI_Allreduce of the
    same inputs. Needs `clustertool plugin deploy` first. Exit code 1 if the run failed,
    printed no rows, or any row has #wrong > 0.
    """
    from clustertool.bench.allreduce import COLUMNS, side_by_side, side_by_side_columns, table_rows
    from clustertool.bench.allreducerun import run_allreduce
    from clustertool.bench.benchrequests import AllreduceBenchRequest
    from clustertool.cli import render
    from clustertool.core.errors import ToolError

    request = AllreduceBenchRequest.of(sizes=sizes, algo=algo, dtype=dtype, op=op, iters=iters, warmup=warmup,
                                       ifname=ifname, env=env, timeout=timeout, tuner_csv=tuner_csv,
                                       request_size=request_size, depth=depth, one_request=one_request)
    result = run_allreduce(open_session(cluster), request,
                           on_line=None if (quiet or json_output) else render.live_line)
    rows = result.rows
    if json_output:
        render.print_json(result.to_dict())
    elif rows:
        render.table(COLUMNS, table_rows(rows), title=f"allreduce on {result.cluster} ({result.ranks} ranks"
                     + (f", {result.servers} reduction servers)" if result.servers is not None else ")"))
        render.table(side_by_side_columns(rows), side_by_side(rows), title="busbw (GB/s) side by side")
    if result.link_line and not json_output:
        render.info(result.link_line)
    if result.tuner_csv is not None:
        render.info(f"wrote {result.tuner_csv}")
    if result.failure:
        raise ToolError(result.failure, hint="run with -x CLUSTERTOOL_DEBUG=1, or check `clustertool plugin status`")
    raise typer.Exit(1 if result.wrong else 0)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
