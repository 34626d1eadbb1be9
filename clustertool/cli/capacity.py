"""`clustertool capacity offerings|buy|ls|block-end`: EC2 Capacity Blocks for ML, and the end of a
cluster's machines that the leader warns jobs of."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, confirm, open_session

if TYPE_CHECKING:  # a fast --help
    from clustertool.cluster.bookings import Table

capacity_app = typer.Typer(
    name="capacity", no_args_is_help=True, add_completion=False,
    help="EC2 Capacity Blocks for ML: find an offering, buy it (money: asks first), list the account's blocks "
         "and reservations; launch into one with `up --capacity-block cr-…`.")

RegionOpt = typer.Option(None, "--region", help="AWS region (default: your profile's / AWS_DEFAULT_REGION).")
ProfileOpt = typer.Option(None, "--profile", help="AWS profile from ~/.aws/config.")


@capacity_app.command("offerings")
def offerings_cmd(
    instance_type: str = typer.Option(..., "--instance-type", help="e.g. p5.48xlarge"),
    nodes: int = typer.Option(..., "--nodes", "-N", help="Instances in the block (the cluster's nodes)."),
    days: int = typer.Option(..., "--days", help="How long the block lasts, in days (1-182)."),
    start_after: Optional[str] = typer.Option(None, "--start-after", metavar="DATE",
                                              help="Earliest start, e.g. 2026-12-01 or 2026-12-01T08:00 (UTC)."),
    end_before: Optional[str] = typer.Option(None, "--end-before", metavar="DATE", help="Latest end (UTC)."),
    region: Optional[str] = RegionOpt,
    profile: Optional[str] = ProfileOpt,
    json_output: bool = JsonOpt,
) -> None:
    """The Capacity Block offerings EC2 has for N x TYPE for DAYS (DescribeCapacityBlockOfferings):
    id, zone, start, end, hours, upfront fee, and what that is per instance-hour and per cluster-hour.
    `clustertool capacity buy ID` buys one (it asks EC2 again, shows the fee and asks first)."""
    from clustertool.cluster import bookings

    _show(bookings.offerings(instance_type, nodes, days, start_after, end_before, region=region, profile=profile),
          json_output)


@capacity_app.command("buy")
def buy_cmd(
    offering: str = typer.Argument(..., metavar="OFFERING", help="An offering id from `capacity offerings`."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Buy without asking (it costs the fee shown)."),
    region: Optional[str] = RegionOpt,
    profile: Optional[str] = ProfileOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Buy a Capacity Block (PurchaseCapacityBlock): EC2 is asked for the offering again, its fee is
    shown, and nothing is bought without your yes (or --yes; with no terminal to ask on, refused).
    The fee goes into the cost ledger (`clustertool cost`); prints the new reservation id for
    `up --capacity-block`."""
    from clustertool.cli import render
    from clustertool.cluster import bookings

    offer = bookings.offer(offering, region=region, profile=profile)
    if not yes:
        if sys.stdin.isatty():
            typer.echo(offer.line, err=True)
        confirm(f"Buy it for {offer.price}, paid now and not refundable?", what=f"buy {offer.line}",
                kept="nothing was bought", unasked=f"clustertool capacity buy {offering} --yes",
                note="nothing was bought")
    elif not json_output:
        typer.echo(f"buying {offer.line}", err=True)
    bought = bookings.buy(offer)
    if json_output:
        render.print_json(bought.data)
        return
    for line in bought.lines:
        typer.echo(line)


@capacity_app.command("ls")
def ls_cmd(
    region: Optional[str] = RegionOpt,
    profile: Optional[str] = ProfileOpt,
    json_output: bool = JsonOpt,
) -> None:
    """The account's Capacity Blocks and Capacity Reservations (DescribeCapacityReservations): state,
    type, zone, instances (free / total), start, end and time left."""
    from clustertool.cluster import bookings

    _show(bookings.reservations(region=region, profile=profile), json_output)


def _show(table: Table, json_output: bool) -> None:
    """A provider's table (providers.base.Table): --json's data, the line for none, or the rows and notes."""
    from clustertool.cli import render

    if json_output:
        render.print_json(table.data)
        return
    if not table.rows:
        typer.echo(table.empty)
        return
    render.table(table.columns, table.rows, title=table.title)
    for line in table.notes:
        typer.echo(line)


@capacity_app.command("block-end")
def block_end_cmd(
    cluster: Optional[str] = ClusterOpt,
    at: Optional[str] = typer.Option(None, "--at", metavar="TIME",
                                     help="When the machines go: +2h (from now) or 2026-12-01T08:00 (UTC). A "
                                          "cluster launched with --capacity-block has it already."),
    warning: Optional[str] = typer.Option(None, "--block-end-warning", metavar="DURATION",
                                          help="How long before then running jobs are signalled (default 30m)."),
    signal: Optional[str] = typer.Option(None, "--block-end-signal", metavar="SIGNAL",
                                         help="What every rank gets: TERM (default), INT, HUP, USR1, USR2, QUIT."),
    off: bool = typer.Option(False, "--off", help="Remove the block end: jobs are not warned."),
    json_output: bool = JsonOpt,
) -> None:
    """Show or set when the cluster's machines go away, and how jobs are warned: the leader's watcher
    sends every rank of each running job the signal that long before (once per job), logs it, and
    `jobs`/`status` show it. Set by `up --capacity-block` (30 minutes before the block's end, when EC2
    starts taking the instances back); here for any cluster (adopted instances in a block, a booked
    machine's end) or to change the warning."""
    from clustertool.cli import render
    from clustertool.cluster import blockend

    result = blockend.configure(open_session(cluster, json_output), at, warning, signal, off)
    if json_output:
        render.print_json(result.to_dict())
        return
    block = result.cluster.block_end
    if not block:
        typer.echo(f"cluster {result.cluster.name}: " + ("block end removed" if result.changed else "no block end"))
        return
    typer.echo(f"cluster {result.cluster.name}: {'block end set: ' if result.changed else ''}"
               f"{blockend.describe(block)}" + (f" (watcher: {result.watcher})" if result.watcher else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(capacity_app, name="capacity")
