"""`cordon` and `uncordon`: keep a bad node out of the hostfiles and jobs, and put it back."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session

if TYPE_CHECKING:  # a fast --help
    from clustertool.cluster.cordon import CordonResult

NodesArg = typer.Argument(..., metavar="NODE...",
                          help="Nodes by name (node-5), range (node-[3-5]), comma list or group (members, servers).")


def cordon(
    nodes: List[str] = NodesArg,
    reason: Optional[str] = typer.Option(None, "--reason", "-r", metavar="TEXT",
                                         help="Why (kept in the cluster record, shown by status and doctor)."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Take nodes out of the hostfiles and of every job's default nodes until `uncordon`.

    `run` (every launcher), `bench` and `plugin check` leave a cordoned node out, and `run --nodes`
    naming it is refused; `exec`, `copy`, `ssh` and `doctor` still reach it, to repair it.  Running
    jobs are not touched (`clustertool kill` stops one).  The leader cannot be cordoned.  A cordoned
    reduction server gets no reducer in `run --plugin` jobs.  The node itself is not contacted, so a
    node that is down can be cordoned; this machine's hostfile and the leader's ~/hostfile are
    written again."""
    from clustertool.cluster import cordon

    result = cordon.cordon(open_session(cluster, json_output), ",".join(nodes), reason=reason)
    _show(result, json_output)


def uncordon(
    nodes: List[str] = NodesArg,
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Put cordoned nodes back into the hostfiles and jobs' default nodes."""
    from clustertool.cluster import cordon

    result = cordon.uncordon(open_session(cluster, json_output), ",".join(nodes))
    _show(result, json_output)


def _show(result: CordonResult, json_output: bool) -> None:
    from clustertool.cli import render
    from clustertool.cluster.cordon import describe
    from clustertool.core import nodeset

    if json_output:
        render.print_json(result.to_dict())
        return
    if result.changed:
        names = nodeset.fold(result.changed)
        if result.verb == "cordon":
            reasons = {(result.cordons[n] or {}).get("reason") for n in result.changed} - {""}
            why = f" ({reasons.pop()})" if len(reasons) == 1 else ""
            typer.echo(f"cordoned {names}{why}: out of the hostfiles and jobs' default nodes; exec and copy "
                       f"still reach it (`clustertool uncordon {names}` puts it back)")
        else:
            typer.echo(f"uncordoned {names}: back in the hostfiles and jobs' default nodes")
    for name in result.unchanged:
        typer.echo(f"{name}: {describe(result.cordons[name]) if result.cordons[name] else 'not cordoned'}, unchanged")
    if result.hostfile:
        typer.echo(f"hostfile {result.hostfile} written; the leader's ~/hostfile: {result.leader_hostfile}")
    if result.slurm:
        typer.echo(f"slurm: {result.slurm}")


def register(app: typer.Typer) -> None:
    app.command()(cordon)
    app.command()(uncordon)
