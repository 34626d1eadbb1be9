"""`clustertool capacity offerings|buy|ls|block-end`: EC2 Capacity Blocks for ML, and the end of a
cluster's machines that the leader warns jobs of."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session
from clustertool.core.errors import UsageError

capacity_app = typer.Typer(
    name="capacity", no_args_is_help=True, add_completion=False,
    help="EC2 Capacity Blocks for ML: find an offering, buy it (money: asks first), list the account's blocks "
         "and reservations; launch into one with `up --capacity-block cr-…`.")

RegionOpt = typer.Option(None, "--region", help="AWS region (default: your profile's / AWS_DEFAULT_REGION).")
ProfileOpt = typer.Option(None, "--profile", help="AWS profile from ~/.aws/config.")


def _money(value: float | None, currency: str = "USD") -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if currency == "USD" else f"{value:,.2f} {currency}"


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
    from clustertool.cli import render
    from clustertool.providers.aws import capacity_offers
    from clustertool.providers.aws.capacity_blocks import utc
    from clustertool.providers.aws.client import Aws

    query = capacity_offers.Query(instance_type, nodes, days, start_after, end_before)
    query.check()  # bad input: one line before any AWS call
    aws = Aws(region=region, profile=profile)
    found = capacity_offers.offerings(aws, query)
    capacity_offers.save_search(aws.region, query, found)
    if json_output:
        render.print_json({"region": aws.region, "query": asdict(query),
                           "offerings": [o.to_dict() for o in found]})
        return
    if not found:
        typer.echo(f"no Capacity Block offerings for {nodes} x {instance_type} for {days} day(s) in {aws.region}"
                   + (" in that date range" if start_after or end_before else ""))
        return
    render.table(["offering", "zone", "start", "end", "hours", "upfront fee", "per instance-hour",
                  "per cluster-hour"],
                 [(o.id, o.az, utc(o.start), utc(o.end), o.hours, _money(o.fee, o.currency),
                   _money(o.per_node_hour, o.currency), _money(o.per_cluster_hour, o.currency)) for o in found],
                 title=f"Capacity Block offerings: {nodes} x {instance_type} for {days} day(s) in {aws.region}")
    typer.echo("per instance-hour = fee / hours / instances; per cluster-hour = fee / hours (all instances). "
               "Buy one with `clustertool capacity buy OFFERING` (asks first).")


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
    from clustertool.cluster import ledger
    from clustertool.providers.aws import capacity_offers
    from clustertool.providers.aws.capacity_blocks import reservation_from

    aws, found = capacity_offers.find_fresh(offering, region, profile)
    line = capacity_offers.describe(found)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"refusing to buy {line} without --yes (no terminal to ask on); nothing was bought")
        typer.echo(line, err=True)
        typer.confirm(f"Buy it for {_money(found.fee, found.currency)}, paid now and not refundable?", abort=True)
    elif not json_output:
        typer.echo(f"buying {line}", err=True)
    bought = reservation_from(capacity_offers.purchase(aws, found))
    ledger.record_purchase(bought.id, f"capacity block {bought.id}", found.fee, "aws", found.instance_type,
                           found.count)
    if json_output:
        render.print_json({"reservation": bought.to_dict(), "offering": found.to_dict(), "fee": found.fee,
                           "currency": found.currency, "ledger": True})
        return
    typer.echo(f"bought: {bought.id} ({bought.total} x {bought.instance_type} in {bought.az}, {bought.time_left()}); "
               f"{_money(found.fee, found.currency)} recorded in the cost ledger")
    typer.echo(f"launch into it: clustertool up -p aws --capacity-block {bought.id} --nodes {bought.total} "
               "--name NAME [--wait]")


@capacity_app.command("ls")
def ls_cmd(
    region: Optional[str] = RegionOpt,
    profile: Optional[str] = ProfileOpt,
    json_output: bool = JsonOpt,
) -> None:
    """The account's Capacity Blocks and Capacity Reservations (DescribeCapacityReservations): state,
    type, zone, instances (free / total), start, end and time left."""
    from clustertool.cli import render
    from clustertool.providers.aws import capacity_blocks
    from clustertool.providers.aws.client import Aws

    aws = Aws(region=region, profile=profile)
    found = capacity_blocks.reservations(aws)
    if json_output:
        render.print_json({"region": aws.region, "reservations": [r.to_dict() for r in found]})
        return
    if not found:
        typer.echo(f"no capacity reservations or blocks in {aws.region}")
        return
    render.table(["reservation", "kind", "state", "type", "zone", "free/total", "start", "end", "time left"],
                 [(r.id, "capacity block" if r.is_block else "ODCR", r.state, r.instance_type, r.az,
                   f"{r.free}/{r.total}", capacity_blocks.utc(r.start), capacity_blocks.utc(r.end), r.time_left())
                  for r in found], title=f"capacity reservations in {aws.region}")


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
