"""`recover`: the recovery loop for jobs run with --replace-failed, on the machine with the cloud credentials."""

from __future__ import annotations

import time
from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, complete_job, open_session


def recover(
    job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                        help="Watch this job until it ends (default: every running job run with "
                                             "--replace-failed, until none is left)."),
    cluster: Optional[str] = ClusterOpt,
    copy: List[str] = typer.Option([], "--copy", metavar="PATH",
                                   help="After a replacement, copy PATH from the leader to the same path on the new "
                                        "node, through the relay (repeat; e.g. the dataset)."),
    poll: float = typer.Option(2.0, "--poll", metavar="SECONDS", help="How often to ask the leader."),
    json_output: bool = JsonOpt,
) -> None:
    """Replace the nodes that running jobs lost, and let those jobs go on (leave it running).

    A job run with `--restarts N --replace-failed` whose node dies (or gets a spot interruption
    notice) stops what is left and waits on the leader (--replace-wait, default 10m). This loop asks
    the leader every few seconds; for a waiting job it runs `replace` on the lost nodes (same code,
    same lock), puts back what their new disks lack (--copy), and tells the leader to start the next
    attempt on them: same job id, CLUSTERTOOL_RESTART_COUNT one higher. Nodes never hold your cloud
    credentials: the replacing happens here. `run --follow --replace-failed` runs this loop for its
    own job. Exit code: the job's (with JOB), else 0; 1 when the leader itself is lost."""
    from clustertool.cli import render
    from clustertool.cluster import controllerproc
    from clustertool.jobs import recovery
    from clustertool.jobs.jobrequests import RecoverRequest

    request = RecoverRequest(job, copy=tuple(copy), poll=poll)
    session = open_session(cluster, json_output)
    session.report(f"recovery loop on {session.name}: watching {job or 'every running job run with --replace-failed'} "
        "(Ctrl-C stops watching; the jobs keep running)")
    pid = controllerproc.running(session.name)
    if pid:
        session.report(f"the cluster's controller (pid {pid}) replaces lost nodes too: each wait is claimed once on "
                       "the leader, so nothing is replaced twice")
    try:
        result = recovery.recover(session, request)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    if json_output:
        render.print_json(result.to_dict())
    else:
        for r in result.recovered:
            typer.echo(f"job {r.job}: {r.cause} at {time.strftime('%H:%M:%S', time.localtime(r.detected))}; "
                       f"{', '.join(r.nodes)} replaced in {r.seconds:.1f}s, attempt {r.attempt + 1} started")
        for job_id, state in result.states.items():
            typer.echo(f"job {job_id}: {state}")
        if not result.watched:
            typer.echo("no running job run with --replace-failed")
        if result.problem:
            typer.echo(f"error: {result.problem}", err=True)
    if result.problem:
        raise typer.Exit(1)
    raise typer.Exit(result.exit_code or 0)


def register(app: typer.Typer) -> None:
    app.command()(recover)
