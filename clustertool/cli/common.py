"""Options shared by many commands."""

from __future__ import annotations

from typing import Optional

import typer

from clustertool import state
from clustertool.model import Reporter, silent

ClusterOpt = typer.Option(None, "-c", "--cluster", metavar="NAME",
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
