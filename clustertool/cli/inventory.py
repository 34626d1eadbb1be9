"""`clustertool inventory`: the cluster for Ansible, JSON consumers or plain ssh."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, open_session


def inventory(
    fmt: str = typer.Option("ansible", "--format", "-f", help="ansible (INI), json, or ssh-config."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Export the cluster's nodes for other tools; ssh goes through the cluster's pinned config.

    ansible: `ansible -i <(clustertool inventory) all -m ping`; groups <cluster>_leader,
    <cluster>_members and <cluster>. ssh-config: Host blocks for <cluster>-leader, <cluster>-node-K.
    """
    from clustertool.cluster.inventory import render
    text = render(open_session(cluster).record, fmt)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        typer.echo(f"wrote {output}", err=True)


def register(app: typer.Typer) -> None:
    app.command("inventory")(inventory)
