"""Options shared by many commands."""

from __future__ import annotations

from typing import Optional

import typer

from clustertool import state
from clustertool.model import Reporter, silent


def complete_cluster(incomplete: str) -> list[str]:
    """Shell completion of -c: the clusters this machine knows (local files only, no network)."""
    return [n for n in state.list_clusters() if n.startswith(incomplete)]


def complete_job(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of a job: ids and names of the cluster's jobs this machine has seen."""
    from clustertool.jobs import records

    try:
        name = state.resolve_name(ctx.params.get("cluster"))
    except Exception:  # no cluster, or several and none named yet: nothing to offer
        return []
    jobs = records.load_all(name)
    words = [j.id for j in jobs] + [j.name for j in jobs if j.name]
    return sorted({w for w in words if w.startswith(incomplete)})


ClusterOpt = typer.Option(None, "-c", "--cluster", metavar="NAME", autocompletion=complete_cluster,
                          help="Cluster to act on (default: the only one known).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")
NodesOpt = typer.Option(None, "--nodes", "-n", metavar="SEL",
                        help="Node selection: all (default), leader, members, node-[2-5], comma lists.")


def cluster_name(name: Optional[str]) -> str:
    return state.resolve_name(name)


def reporter(json_output: bool) -> Reporter:
    """Progress lines on stderr, or none with --json (stdout stays clean data)."""
    from clustertool.cli import render

    return silent if json_output else render.info
