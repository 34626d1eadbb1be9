"""`repair-mounts`: mount the cluster's shared filesystems again where a node lost them."""

from __future__ import annotations

from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, NodesOpt, open_session, reporter


def repair_mounts(
    nodes: Optional[str] = NodesOpt,
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Mount each shared filesystem (`up --shared-fs`) on every node that lacks it, or whose mount no longer
    answers (a dead FUSE / NFS mount is unmounted first); nodes where it is mounted and answering are left
    alone. What `doctor --check shared-fs` names as the fix; `up`, `start` and `reboot` do it too.
    Exit 1 when a node could not mount it."""
    from clustertool.cli import render
    from clustertool.core import nodeset
    from clustertool.sharedfs import mount

    session = open_session(cluster, json_output)
    record = session.ready()
    names = [n.name for n in nodeset.select(record, nodes)] if nodes else None
    reporter(json_output)(f"checking the shared mounts of {record.name}")
    results = mount.repair(session, record, names)
    if json_output:
        render.print_json({"cluster": record.name, "mounts": [{**r.__dict__, "ok": r.ok} for r in results]})
    else:
        for line in mount.summary(results, "mounted again"):
            typer.echo(line)
        for r in results:
            if not r.ok:
                typer.echo(f"{r.node} {r.mount}: {r.detail or r.state}", err=True)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)


def register(app: typer.Typer) -> None:
    app.command("repair-mounts")(repair_mounts)
