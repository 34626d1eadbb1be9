"""`clustertool stragglers JOB`: the workers that made the others wait, from the reducers' lateness records."""

from __future__ import annotations

from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, complete_job, open_session


def stragglers(
    job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                        help="Job id, unique prefix or name (default: the one running job)."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Name the workers that made the others wait, most first: each one's p50/p99 lateness (its data after the
    first worker's, per request, at the reduction servers), the share of requests it came last in, and how long
    the others waited for it alone.

    With reduction servers (`run --plugin` on a cluster with --reduction-servers) from the reducers' records,
    live while the job runs and after it; without servers, from the plugin's own wait per rank (its CollNet stats,
    written when the communicator closes). A job with neither says so.
    """
    import clustertool.watch.stragglers
    from clustertool.cli import render

    report = clustertool.watch.stragglers.fetch(open_session(cluster, json_output), job)
    if json_output:
        render.print_json(report.to_dict())
        return
    rows = [(w.worker, w.node or "-", "-" if w.last_share is None else f"{100 * w.last_share:.0f}%",
             _ms(w.p50_ms), _ms(w.p99_ms), f"{w.waited_for_s:.2f} s", "STRAGGLER" if w.straggler else "")
            for w in report.workers]
    if rows:
        waits = report.source == "collnet-stats"
        render.table(["WORKER" if not waits else "RANK", "NODE", "LAST", "WAIT p50" if waits else "LATE p50",
                      "WAIT p99" if waits else "LATE p99", "WAITED FOR", ""], rows,
                     title=f"job {report.job}: {', '.join('worker ' + w.worker for w in report.stragglers) or 'no'} "
                           "straggler(s)")
    typer.echo(f"job {report.job}: {report.note}", err=not rows)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def register(app: typer.Typer) -> None:
    app.command("stragglers")(stragglers)
