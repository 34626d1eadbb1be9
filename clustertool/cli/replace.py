"""`replace`: a new machine for a node that died, under the same name, role, slots and address."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session, reporter
from clustertool.core.errors import UsageError


def replace(
    nodes: List[str] = typer.Argument(..., metavar="NODE...",
                                      help="Nodes by name (node-3), range (node-[3-4]) or comma list."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Replace nodes with new machines: same name, role, slots, address and place in the hostfiles.

    For a node that died (or misbehaves): the old machine is removed (its processes, and with it
    everything on its disk: home, /scratch, /tmp) and a new one made; its new host key is pinned
    and the old one removed from every known_hosts, here and on every node; the cluster key and
    hostfiles are pushed again.  A cordon on a replaced node is lifted.  Each node is all or
    nothing: a failure removes what was made for it and marks it in `status`.

    Local provider: a new namespace, sshd and disk (the leader too).  AWS: not yet (cordon, or
    `down` and `up`).  Static / adopted machines are not ours to replace: `cordon` them."""
    from clustertool.cli import render
    from clustertool.cluster.replace import replace as do_replace

    session = open_session(cluster, json_output)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"refusing to replace {', '.join(nodes)} without --yes (no terminal to ask on)",
                             hint="everything on the old machine's disk is lost; add --yes to go ahead")
        typer.confirm(f"Replace {', '.join(nodes)} of {session.name!r}? Everything on the old disk is lost",
                      abort=True)
    result = do_replace(session, ",".join(nodes), report=reporter(json_output))
    if json_output:
        render.print_json(result.to_dict())
        return
    for r in result.replaced:
        typer.echo(f"{r.node} replaced in {r.seconds:.1f}s: host key {r.new_host_key} pinned (was {r.old_host_key})"
                   + ("; its cordon is lifted" if r.cordon_lifted else ""))
    typer.echo(result.disk)
    typer.echo(f"hostfile {result.hostfile} and the leader's ~/hostfile written ({result.seconds:.1f}s in all)")


def register(app: typer.Typer) -> None:
    app.command()(replace)
