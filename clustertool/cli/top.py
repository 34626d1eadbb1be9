"""`clustertool top`: every node and every running job's ranks, live, over one stream through the leader."""

from __future__ import annotations

from typing import Any, List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session

RANKS_SHOWN = 16
STYLE = {"outlier": "bold red", "warn": "yellow", "muted": "dim", "": ""}


def top(
    cluster: Optional[str] = ClusterOpt,
    job: Optional[List[str]] = typer.Option(
        None, "--job", "-j", metavar="JOB", help="Only this job (id, prefix or name; repeat); default: all running."),
    once: bool = typer.Option(
        False, "--once", help="One reading (after a few samples, for rates and outliers), then exit."),
    interval: Optional[float] = typer.Option(
        None, "--interval", metavar="SECONDS", help="Seconds between readings (default 1; --once: 0.3)."),
    metric_regex: Optional[List[str]] = typer.Option(
        None, "--metric-regex", metavar="REGEX",
        help="How to read a step from your log lines (repeat): a Python regex with a named group step, and "
             "optionally time with unit (s|ms|us), loss, total, rate with rate_unit (it/s|s/it). Tried before "
             "the defaults (Megatron, DeepSpeed, nanoGPT, tqdm, 'step N ... time T ms')."),
    ranks: int = typer.Option(RANKS_SHOWN, "--ranks", metavar="N",
                              help="Ranks shown per job (outliers and slowest first)."),
    json_output: bool = JsonOpt,
) -> None:
    """Show every node (GPUs, CPU, memory, network, disk, cordons) and every running job's ranks, live.

    One ssh session to the leader carries it all: the leader samples every node over the cluster's own
    ssh (one connection per node for as long as top runs). A rank whose step time, or a node whose
    network rate, is more than 1.25x off the median for 3 readings in a row is shown as an outlier.
    --once --json prints one reading for scripts (with --json, --once is implied).
    """
    from clustertool.watch.hub import WatchRequest, snapshot, stream

    request = WatchRequest(jobs=tuple(job or ()), regex=tuple(metric_regex or ()),
                           interval=interval or (0.3 if (once or json_output) else 1.0))
    session = open_session(cluster, json_output)
    if once or json_output:
        view = snapshot(session, request)
        if json_output:
            from clustertool.cli import render

            render.print_json(view)
        else:
            _print_plain(view, ranks)
        return
    _live(stream(session, request), ranks)


def _tables(view: dict[str, Any], limit: int) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    from clustertool.watch.view import (
        NODE_HEADER,
        RANK_HEADER,
        job_title,
        late_nodes,
        node_row,
        rank_row,
        ranks_shown,
        summary_lines,
    )

    def styled(cells: list[tuple[str, str]]) -> list[Text]:
        return [Text(text, style=STYLE[flag]) for text, flag in cells]

    nodes = Table(title=f"{view.get('cluster', '')}: {len(view['nodes'])} node(s)", title_justify="left",
                  header_style="bold")
    for col in NODE_HEADER:
        nodes.add_column(col, no_wrap=True)
    for row in view["nodes"]:
        nodes.add_row(*styled(node_row(row)))
    out: list[Any] = [nodes]
    for job in view["jobs"]:
        t = Table(title=job_title(job), title_justify="left", header_style="bold")
        for col in RANK_HEADER:
            t.add_column(col, no_wrap=True)
        late = late_nodes(job)
        for rank in ranks_shown(job, limit):
            t.add_row(*styled(rank_row(rank, late)))
        out.append(t)
    if not view["jobs"]:
        out.append(Text("no running job", style="dim"))
    out += [Text(line, style="bold red") for line in summary_lines(view)]
    return out


def _print_plain(view: dict[str, Any], limit: int) -> None:
    from clustertool.cli import render

    console = render._console()
    for part in _tables(view, limit):
        console.print(part)


def _live(hub: Any, limit: int) -> None:
    """Redraw in place on a terminal; elsewhere (a pipe, a file) one block per reading. Ctrl-C leaves."""
    from rich.console import Group
    from rich.live import Live

    from clustertool.cli import render

    try:
        with hub:
            if not render.is_terminal():
                for view in hub.views():
                    _print_plain(view, limit)
                    print(flush=True)
                return
            with Live(console=render._console(), auto_refresh=False, screen=False) as live:
                for view in hub.views():
                    live.update(Group(*_tables(view, limit)), refresh=True)
    except KeyboardInterrupt:
        return


def register(app: typer.Typer) -> None:
    app.command("top")(top)
