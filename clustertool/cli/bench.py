"""`clustertool bench ...`: benchmarks across the cluster (scaling; allreduce lives here too)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, cluster_name

bench_app = typer.Typer(name="bench", no_args_is_help=True, add_completion=False,
                        help="Benchmarks across the cluster: scaling of a training job, allreduce bandwidth.")


@bench_app.command("scaling", context_settings={"allow_interspersed_args": False})
def scaling(
    command: List[str] = typer.Argument(..., help="The job, after --: run by mpirun at each size. One argument is split like a shell line."),
    nodes: str = typer.Option("1,2,4", "--nodes", "-N", help="Cluster sizes to run at, e.g. 1,2,4 (first N nodes, leader first)."),
    per_node: Optional[int] = typer.Option(None, "--per-node", help="Ranks per node (default: the nodes' slots)."),
    metric_regex: Optional[str] = typer.Option(None, "--metric-regex", help="Regex with one group around the throughput number (default: images/sec, samples/sec, img/sec ... figures)."),
    env: List[str] = typer.Option([], "-x", "--env", help="VAR or VAR=VALUE exported to every rank (repeatable)."),
    timeout: float = typer.Option(1800, "--timeout", help="Seconds per size before the run counts as hung."),
    repeat: int = typer.Option(1, "--repeat", "-r", help="Runs per size, round-robin over the sizes; the median counts (for noisy, shared machines)."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write the table as CSV here."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the table as JSON here."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write a PNG chart (throughput and efficiency vs ranks) here."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="Keep each size's full output here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream the job's output."),
    plugin: bool = typer.Option(False, "--plugin", help="Run with the deployed NCCL plugin's environment (as `run --plugin`)."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Run the same job at several cluster sizes and report throughput, speedup and scaling efficiency.

    Each size runs `mpirun -np N*K -H leader:K,node-2:K,... COMMAND` on the leader. Throughput is
    parsed from the output: the last "total ... images/sec" line, else the sum over rank-tagged
    lines, else the last "samples/sec: N"-like figure. Efficiency = speedup / (ranks / base ranks).
    Exit code 1 if any size failed or printed no figure.
    """
    from clustertool import state
    from clustertool.bench import scaling as core
    from clustertool.bench.launch import launcher
    from clustertool.cli import render

    sizes = core.parse_sizes(nodes)
    c = state.load(cluster_name(cluster))
    _warn_shared_cpus(c, sizes, per_node)
    on_line = None if quiet else render.live_line
    launch = launcher(c, env=env, timeout=timeout, on_line=on_line, plugin=plugin)
    result = core.run_scaling(c, sizes, per_node, command, launch=launch, regex=metric_regex,
                              log_dir=log_dir, repeat=repeat, report=render.info)
    render.table(core.COLUMNS, core.rows(result), title=f"scaling on {c.name}: {result.command}")
    for path, text in ((csv_path, core.to_csv), (json_path, core.to_json)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text(result))
            typer.echo(f"wrote {path}")
    if chart is not None:
        from clustertool.bench.chart import write_chart

        typer.echo(f"chart: {write_chart(result, chart)}")
    raise typer.Exit(0 if result.ok else 1)


def _warn_shared_cpus(cluster, sizes, per_node) -> None:
    """Local nodes share this machine's CPUs: past that many ranks, throughput cannot grow."""
    import os

    from clustertool.cli import render

    ranks = max(sizes) * (per_node or 1)
    cpus = os.cpu_count() or 1
    if cluster.provider == "local" and ranks > cpus:
        render.info(f"note: local nodes share this machine's {cpus} CPU(s); at {ranks} ranks they compete "
                    f"for them, so scaling past {cpus} rank(s) measures the CPU limit, not the network")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
