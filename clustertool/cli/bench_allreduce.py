"""`clustertool bench allreduce`: the plugin's allreduce vs Open MPI's, across the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, cluster_name


def allreduce(
    sizes: str = typer.Option("1M:256M", "--sizes", help="MIN:MAX message sizes in bytes (K/M/G), doubling."),
    algo: str = typer.Option("sharded,ring,mpi", "--algo", help="Comma list of sharded, ring (the plugin's) and mpi "
                             "(Open MPI's MPI_Allreduce on the same ranks)."),
    dtype: str = typer.Option("float", "--dtype", help="float, half, bfloat16, double, int32, int64, ..."),
    op: str = typer.Option("sum", "--op", help="sum, prod, min or max."),
    iters: int = typer.Option(5, "--iters", "-n", help="Timed iterations per size."),
    warmup: int = typer.Option(1, "--warmup", "-w", help="Untimed iterations per size."),
    ifname: Optional[str] = typer.Option(None, "--ifname", help="Interface the plugin binds to (default: first non-loopback)."),
    env: List[str] = typer.Option([], "-x", "--env", help="VAR or VAR=VALUE for every rank, e.g. CLUSTERTOOL_SOCKS_PER_PEER=2."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds before the run counts as hung."),
    tuner_csv: Optional[Path] = typer.Option(None, "--tuner-csv", help="Write a tuner table from the results here "
                                             "(CollNet where the plugin won); deploy it with `plugin deploy --tuner-table`."),
    json_output: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream collnet_bench's output."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Run collnet_bench on every node (one rank per node) and print the all_reduce_perf table.

    busbw = algbw * 2(n-1)/n; #wrong counts elements that differ from MPI_Allreduce of the
    same inputs. Needs `clustertool plugin deploy` first. Exit code 1 if the run failed,
    printed no rows, or any row has #wrong > 0.
    """
    from dataclasses import asdict

    from clustertool import state
    from clustertool.bench import allreduce as core
    from clustertool.cli import render
    from clustertool.plugin import build as native
    from clustertool.errors import ToolError
    from clustertool.bench.launch import launcher

    c = state.load(cluster_name(cluster))
    deployed = native.load_record(c.name).get("deployed")
    if not deployed:
        raise ToolError(f"the plugin is not deployed on {c.name!r}", hint="clustertool plugin build && clustertool plugin deploy")
    argv = core.bench_argv(f"{deployed['dest'].rstrip('/')}/{native.BENCH}", core.parse_sizes(sizes),
                           core.parse_algos(algo), dtype=dtype, op=op, iters=iters, warmup=warmup)
    extra = [f"CLUSTERTOOL_SOCKET_IFNAME={ifname}"] if ifname else []
    on_line = None if (quiet or json_output) else render.live_line
    launch = launcher(c, env=extra + list(env), timeout=timeout, on_line=on_line)
    code, output, error = launch(c.ordered_nodes(), 1, argv)
    rows = core.parse_rows(output)
    if json_output:
        render.print_json({"exit_code": code, "error": error, "rows": [asdict(r) for r in rows]})
    elif rows:
        render.table(core.COLUMNS, core.table_rows(rows), title=f"allreduce on {c.name} ({len(c.nodes)} ranks)")
        render.table(core.side_by_side_columns(rows), core.side_by_side(rows), title="busbw (GB/s) side by side")
    if tuner_csv is not None and rows:
        tuner_csv.parent.mkdir(parents=True, exist_ok=True)
        tuner_csv.write_text(core.tuner_csv(rows, len(c.nodes)))
        render.info(f"wrote {tuner_csv}")
    if error or code != 0 or not rows:
        raise ToolError(f"allreduce benchmark failed: {error or f'mpirun exit {code}' if code else 'no result rows'}",
                        hint="run with -x CLUSTERTOOL_DEBUG=1, or check `clustertool plugin status`")
    raise typer.Exit(1 if any(r.wrong > 0 for r in rows) else 0)


def register(app: typer.Typer) -> None:
    from clustertool.cli.bench import bench_app

    bench_app.command("allreduce")(allreduce)
