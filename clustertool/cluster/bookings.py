"""`clustertool capacity offerings|buy|ls`: machines booked ahead (EC2 Capacity Blocks), through
the provider's capacity hooks (providers/base.py); a purchase goes into the cost ledger."""

from __future__ import annotations

from clustertool.cluster import ledger
from clustertool.providers.base import CapacityQuery, Offer, Purchase, Table, get_provider

PROVIDER = "aws"  # whose capacity `clustertool capacity` books


def offerings(instance_type: str, nodes: int, days: int, start_after: str | None = None,
              end_before: str | None = None, *, region: str | None = None, profile: str | None = None,
              provider: str = PROVIDER) -> Table:
    query = CapacityQuery(instance_type, nodes, days, start_after, end_before)
    return get_provider(provider).capacity_offerings(query, region, profile)


def offer(offer_id: str, *, region: str | None = None, profile: str | None = None,
          provider: str = PROVIDER) -> Offer:
    """The offering as offered now (the last `capacity offerings` search asked again): what it costs."""
    return get_provider(provider).capacity_offer(offer_id, region, profile)


def buy(offered: Offer, provider: str = PROVIDER) -> Purchase:
    """Buy ``offered`` (money: ask the user first) and record its fee in the cost ledger."""
    bought = get_provider(provider).buy_capacity(offered)
    ledger.record_purchase(bought.id, bought.what, offered.fee, provider, offered.node_type, offered.count)
    bought.data["ledger"] = True
    return bought


def reservations(*, region: str | None = None, profile: str | None = None, provider: str = PROVIDER) -> Table:
    return get_provider(provider).reservations(region, profile)
