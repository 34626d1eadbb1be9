"""`clustertool report JOB`: a PNG and a self-contained HTML page of a run, from its watch record."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, complete_job, open_session


def report(
    job: str = typer.Argument(..., metavar="JOB", autocompletion=complete_job, help="Job id, unique prefix or name."),
    cluster: Optional[str] = ClusterOpt,
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="PREFIX",
                                          help="Write PREFIX.html and PREFIX.png (default: ./<job>-report)."),
    json_output: bool = JsonOpt,
) -> None:
    """Draw a job's run: GPU utilisation, step rate and network per node over time, restarts, cordons and
    stragglers marked; as a PNG (needs matplotlib, the train extra) and a self-contained HTML page.

    From the samples recorded beside the job's logs on the leader while it ran (every job records its nodes
    every 5 s unless run with --no-record; `monitoring enable`'s exporter records too). `run --follow` writes
    the report by itself when the job ends. --json: the series and events.
    """
    from clustertool.cli import render
    from clustertool.watch.report import fetch, write

    run = fetch(open_session(cluster, json_output), job)
    files = write(run, output or Path(f"{run.job}-report"))
    if json_output:
        render.print_json({"files": files.to_dict(), "run": run.to_dict()})
        return
    typer.echo(files.html)
    if files.png:
        typer.echo(files.png)
    else:
        typer.echo(f"no PNG: {files.png_skipped}", err=True)
    for e in run.events:
        typer.echo(f"{e.t / 60:6.1f} min  {e.label}" + ("" if e.end is None else f" ({e.end - e.t:.0f} s)"), err=True)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
