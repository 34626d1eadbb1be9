"""The capacity hooks' bodies (providers/base.py): what `clustertool capacity offerings|buy|ls`
shows and buys, as data the CLI renders (tables, lines, what --json prints)."""

from __future__ import annotations

from dataclasses import asdict

from clustertool.providers.aws import capacity_offers
from clustertool.providers.aws.capacity_blocks import reservation_from, reservations, utc
from clustertool.providers.aws.client import Aws
from clustertool.providers.base import CapacityQuery, Offer, Purchase, Table

NOTE = ("per instance-hour = fee / hours / instances; per cluster-hour = fee / hours (all instances). "
        "Buy one with `clustertool capacity buy OFFERING` (asks first).")


def money(value: float | None, currency: str = "USD") -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if currency == "USD" else f"{value:,.2f} {currency}"


def offerings(wanted: CapacityQuery, region: str | None, profile: str | None) -> Table:
    """DescribeCapacityBlockOfferings for ``wanted``, remembered for `capacity buy`."""
    query = capacity_offers.Query(**asdict(wanted))
    query.check()  # bad input: one line before any AWS call
    aws = Aws(region=region, profile=profile)
    found = capacity_offers.offerings(aws, query)
    capacity_offers.save_search(aws.region, query, found)
    what = f"{query.nodes} x {query.instance_type} for {query.days} day(s) in {aws.region}"
    return Table(
        f"Capacity Block offerings: {what}",
        ["offering", "zone", "start", "end", "hours", "upfront fee", "per instance-hour", "per cluster-hour"],
        [(o.id, o.az, utc(o.start), utc(o.end), o.hours, money(o.fee, o.currency), money(o.per_node_hour, o.currency),
          money(o.per_cluster_hour, o.currency)) for o in found],
        {"region": aws.region, "query": asdict(query), "offerings": [o.to_dict() for o in found]},
        empty=f"no Capacity Block offerings for {what}"
              + (" in that date range" if query.start_after or query.end_before else ""),
        notes=[NOTE])


def offer(offer_id: str, region: str | None, profile: str | None) -> Offer:
    aws, found = capacity_offers.find_fresh(offer_id, region, profile)
    return Offer(found.id, capacity_offers.describe(found), money(found.fee, found.currency), found.fee,
                 found.instance_type, found.count, (aws, found))


def buy(offered: Offer) -> Purchase:
    """PurchaseCapacityBlock; the lines say the fee went into the cost ledger (the caller records it)."""
    aws, found = offered.handle
    bought = reservation_from(capacity_offers.purchase(aws, found))
    return Purchase(
        bought.id, f"capacity block {bought.id}",
        {"reservation": bought.to_dict(), "offering": found.to_dict(), "fee": found.fee, "currency": found.currency},
        [f"bought: {bought.id} ({bought.total} x {bought.instance_type} in {bought.az}, {bought.time_left()}); "
         f"{offered.price} recorded in the cost ledger",
         f"launch into it: clustertool up -p aws --capacity-block {bought.id} --nodes {bought.total} "
         "--name NAME [--wait]"])


def reservations_table(region: str | None, profile: str | None) -> Table:
    """DescribeCapacityReservations: the account's blocks and ODCRs."""
    aws = Aws(region=region, profile=profile)
    found = reservations(aws)
    return Table(
        f"capacity reservations in {aws.region}",
        ["reservation", "kind", "state", "type", "zone", "free/total", "start", "end", "time left"],
        [(r.id, "capacity block" if r.is_block else "ODCR", r.state, r.instance_type, r.az, f"{r.free}/{r.total}",
          utc(r.start), utc(r.end), r.time_left()) for r in found],
        {"region": aws.region, "reservations": [r.to_dict() for r in found]},
        empty=f"no capacity reservations or blocks in {aws.region}")
