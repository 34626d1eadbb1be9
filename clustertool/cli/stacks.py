"""`clustertool stacks`: the Python stack of every rank of a running job, identical stacks folded."""

from __future__ import annotations

from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, complete_job, open_session


def stacks(
    job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                        help="Job id, unique prefix or name (default: the one running job)."),
    cluster: Optional[str] = ClusterOpt,
    py_spy: Optional[str] = typer.Option(None, "--py-spy", metavar="PATH",
                                         help="py-spy's path on the nodes (default: found there by itself)."),
    no_py_spy: bool = typer.Option(False, "--no-py-spy",
                                   help="Do not use py-spy (it pauses each rank a moment): only what /proc says."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds for one rank's py-spy (ranks go at once)."),
    json_output: bool = JsonOpt,
) -> None:
    """Dump the Python stack of every rank of a running job, ranks with the same stack folded.

    Each node asks py-spy (`py-spy dump`) for its ranks' stacks; one line per group of ranks with
    the same stack, biggest group first, innermost frame first (library frames between the user's
    shown as …). Without py-spy (or with --no-py-spy) a rank shows its state, system call, wchan,
    CPU time and command line from /proc. --json: every rank's threads and frames, and the groups.

    Ranks started by a node launcher (torchrun, accelerate, deepspeed, process) also dump PyTorch's Flight
    Recorder (their last collectives): one line per process group says which ranks wait in which collective and
    which never called it, or called another one.
    """
    from clustertool.cli import render
    from clustertool.core.errors import UsageError
    from clustertool.jobs import stacks
    from clustertool.jobs.jobrequests import StacksRequest

    if py_spy and no_py_spy:
        raise UsageError("--py-spy and --no-py-spy exclude each other")
    request = StacksRequest(job, py_spy=False if no_py_spy else py_spy, timeout=timeout)
    result = stacks.stacks(open_session(cluster, json_output), request)
    if json_output:
        render.print_json(result.to_dict())
    else:
        for group in result.groups:
            typer.echo(f"{group.label}: {group.summary}")
        if not result.groups:
            typer.echo(f"job {result.job.id}: no rank found")
        for line in result.flight:
            typer.echo(line)
        for line in result.problems:
            typer.echo(line)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("stacks")(stacks)
