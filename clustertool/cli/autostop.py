"""`clustertool autostop` (the cluster stops itself when idle) and `clustertool cost` (the ledger)."""

from __future__ import annotations

import datetime
import time
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session
from clustertool.core.errors import UsageError


def autostop(
    idle: Optional[str] = typer.Argument(None, metavar="[IDLE]",
                                         help="How long the cluster may stay idle: 30m, 1h, 1h30m, 90s "
                                              "(a bare number is minutes). Leave out to show the setting."),
    cluster: Optional[str] = ClusterOpt,
    down: bool = typer.Option(False, "--down", help="Terminate the nodes instead of stopping them (autodown)."),
    wait_for: Optional[str] = typer.Option(None, "--wait-for", metavar="jobs|jobs-and-ssh",
                                           help="What keeps the cluster busy besides GPU use: clustertool jobs "
                                                "(default), or jobs and interactive SSH sessions."),
    cancel: bool = typer.Option(False, "--cancel", help="Stop counting: the cluster stays up until you stop it."),
    show: bool = typer.Option(False, "--show", help="Show the setting and the idle time so far (the default "
                                                    "without IDLE)."),
    json_output: bool = JsonOpt,
) -> None:
    """Stop (or with --down terminate) the cluster after IDLE with no job, no GPU use (nvidia-smi on every
    node) and, with --wait-for jobs-and-ssh, no interactive SSH session. The leader decides and powers
    the nodes off (members first), so it happens even when this machine is off."""
    from clustertool.cli import render
    from clustertool.cluster.autostop import check_request, configure

    if show and (idle is not None or cancel):
        raise UsageError("--show only shows: give it alone")
    check_request(idle, down=down, wait_for=wait_for, cancel=cancel)  # before looking for the cluster
    result = configure(open_session(cluster, json_output), idle, down=down, wait_for=wait_for, cancel=cancel)
    if json_output:
        render.print_json(result.to_dict())
        return
    c = result.cluster
    if result.changed:
        typer.echo(f"cluster {c.name}: " + (f"autostop set: {result.setting.describe()}" if result.setting
                                             else "autostop cancelled"))
    for key, value in result.lines().items():
        typer.echo(f"{key}: {value}")
    if result.view and result.view.log and not result.changed:
        typer.echo("leader's log:")
        for line in result.view.log:
            typer.echo(f"  {line}")


def _since(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"invalid --since {text!r}", hint="write a date as 2026-11-01 (or 2026-11-01T09:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _hours(h: float) -> str:
    return f"{h:.2f}"


def _usd(value: Optional[float]) -> str:
    return "?" if value is None else f"${value:,.2f}"


def cost(
    since: Optional[str] = typer.Option(None, "--since", metavar="DATE",
                                        help="Count from this date (UTC), e.g. 2026-11-01."),
    json_output: bool = JsonOpt,
) -> None:
    """Every cluster this machine made, live or gone: node type and count, hours up and stopped, and an
    estimated cost (approximate: the price table `up` shows), with the hours autostop saved."""
    from clustertool.cli import render
    from clustertool.cluster import ledger
    from clustertool.cluster.autostop import refresh
    from clustertool.cluster.status import list_all

    refresh(list_all())  # a cluster its watcher powered off counts as off
    result = ledger.report(since=_since(since), known=list_all())
    if json_output:
        render.print_json(result.to_dict())
        return
    if not result.clusters:
        typer.echo("no clusters in the ledger" + (" since then" if since else ""))
        return
    render.table(["cluster", "id", "nodes", "type", "state", "hours up", "hours stopped", "cost (approx.)",
                  "saved by autostop"],
                 [(c.name, c.id, c.nodes, c.type, c.state, _hours(c.hours_up), _hours(c.hours_stopped),
                   _usd(c.cost), f"{_hours(c.hours_saved)} h, {_usd(c.saved)}" if c.hours_saved else "-")
                  for c in result.clusters],
                 title="clusters made from this clustertool home" + (f" since {since}" if since else ""))
    typer.echo(f"total: {_usd(result.total)} (approximate), autostop saved {_usd(result.total_saved)}")
    typer.echo(f"basis: {ledger.basis()}")
    unknown = [c for c in result.clusters if c.hourly is None]
    if unknown:
        typer.echo("not priced: " + "; ".join(f"{c.name} ({', '.join(c.notes)})" for c in unknown))
    typer.echo(f"as of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def register(app: typer.Typer) -> None:
    app.command()(autostop)
    app.command()(cost)
