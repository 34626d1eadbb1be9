"""EC2 Capacity Blocks for ML, before `up`: the offerings EC2 has (`capacity offerings`) and buying
one (`capacity buy`).

An offering is N instances of a type in one zone from a start to an end, at an upfront fee.  EC2's
DescribeCapacityBlockOfferings takes no offering id, so `capacity offerings` keeps its last search
(``$CLUSTERTOOL_HOME/capacity-offerings.json``) and `capacity buy ID` asks EC2 the same question
again: the fee it shows and asks you to confirm is EC2's answer of that moment, and an offering that
is gone is refused before anything is bought.  The purchase is one PurchaseCapacityBlock (platform
Linux/UNIX), written to the cost ledger as spent.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from clustertool.core import state
from clustertool.core.errors import ProviderError, UsageError
from clustertool.providers.aws.capacity_blocks import MAX_DAYS, PLATFORM, epoch, parse_date, utc
from clustertool.providers.aws.client import Aws, aws_errors

CACHE = "capacity-offerings.json"
CACHE_MAX_AGE_S = 24 * 3600  # an older search is asked for again, not trusted


@dataclass
class Offering:
    id: str
    instance_type: str
    az: str
    count: int
    start: float
    end: float
    hours: int
    fee: float  # upfront, in ``currency``
    currency: str = "USD"

    @property
    def per_node_hour(self) -> float | None:
        return self.fee / self.hours / self.count if self.hours and self.count else None

    @property
    def per_cluster_hour(self) -> float | None:
        return self.fee / self.hours if self.hours else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(start=utc(self.start), end=utc(self.end), start_epoch=self.start, end_epoch=self.end,
                   per_node_hour=_round(self.per_node_hour), per_cluster_hour=_round(self.per_cluster_hour))
        return out


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def offering_from(doc: dict) -> Offering:
    """One item of DescribeCapacityBlockOfferings' CapacityBlockOfferings."""
    hours = int(doc.get("CapacityBlockDurationHours") or 0)
    start, end = epoch(doc.get("StartDate")) or 0.0, epoch(doc.get("EndDate")) or 0.0
    if not hours and end > start:
        hours = int(round((end - start) / 3600))
    try:
        fee = float(doc.get("UpfrontFee") or 0)
    except ValueError:
        fee = 0.0
    return Offering(id=doc["CapacityBlockOfferingId"], instance_type=doc.get("InstanceType", ""),
                    az=doc.get("AvailabilityZone", ""), count=int(doc.get("InstanceCount") or 0), start=start,
                    end=end, hours=hours, fee=fee, currency=doc.get("CurrencyCode") or "USD")


@dataclass
class Query:
    """What `capacity offerings` asks for (also what `capacity buy` asks again, for a fresh fee)."""

    instance_type: str
    nodes: int
    days: int
    start_after: str | None = None
    end_before: str | None = None

    def check(self) -> None:
        if self.nodes < 1:
            raise UsageError(f"--nodes: expected 1 or more, got {self.nodes}", hint="e.g. --nodes 4")
        if not 1 <= self.days <= MAX_DAYS:
            raise UsageError(f"--days: a Capacity Block lasts 1 to {MAX_DAYS} days, got {self.days}")
        first, last = self.dates()
        if first and last and last <= first:
            raise UsageError("--end-before must be after --start-after")

    def dates(self) -> tuple[dt.datetime | None, dt.datetime | None]:
        return (parse_date(self.start_after, "--start-after") if self.start_after else None,
                parse_date(self.end_before, "--end-before") if self.end_before else None)

    def params(self) -> dict[str, Any]:
        """DescribeCapacityBlockOfferings' request (botocore's EC2 model names)."""
        first, last = self.dates()
        out: dict[str, Any] = {"InstanceType": self.instance_type, "InstanceCount": self.nodes,
                               "CapacityDurationHours": self.days * 24}
        if first:
            out["StartDateRange"] = first
        if last:
            out["EndDateRange"] = last
        return out


def offerings(aws: Aws, query: Query) -> list[Offering]:
    """The offerings EC2 has for ``query``, earliest start first."""
    query.check()
    with aws_errors("listing Capacity Block offerings"):
        docs = aws.paginate("describe_capacity_block_offerings", "CapacityBlockOfferings", **query.params())
    return sorted((offering_from(d) for d in docs), key=lambda o: (o.start, o.fee, o.az))


def purchase(aws: Aws, offering: Offering, tags: list[dict] | None = None) -> dict[str, Any]:
    """PurchaseCapacityBlock: the new reservation (a CapacityReservation document)."""
    params: dict[str, Any] = {"CapacityBlockOfferingId": offering.id, "InstancePlatform": PLATFORM}
    if tags:
        params["TagSpecifications"] = [{"ResourceType": "capacity-reservation", "Tags": tags}]
    with aws_errors(f"buying Capacity Block offering {offering.id}"):
        answer = aws.call("purchase_capacity_block", **params)
    reservation = answer.get("CapacityReservation") or {}
    if not reservation.get("CapacityReservationId"):
        raise ProviderError(f"PurchaseCapacityBlock of {offering.id} answered without a reservation id",
                            hint="`clustertool capacity ls` shows the account's blocks; check before buying again")
    return reservation


# ---- the last search, for `capacity buy` ----------------------------------------------------

def save_search(region: str, query: Query, found: list[Offering]) -> None:
    path = state.home() / CACHE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"t": time.time(), "region": region, "query": asdict(query),
                               "offerings": [o.id for o in found]}))
    os.replace(tmp, path)


def load_search() -> dict | None:
    try:
        doc = json.loads((state.home() / CACHE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("query"), dict) else None


def find_fresh(offering_id: str, region: str | None, profile: str | None) -> tuple[Aws, Offering]:
    """The offering as EC2 offers it now: the last `capacity offerings` search asked again."""
    search = load_search()
    again = "run `clustertool capacity offerings --instance-type T --nodes N --days D` and buy one of the ids it lists"
    if not search or offering_id not in search.get("offerings", []):
        raise UsageError(f"offering {offering_id} is not in the last `capacity offerings` list", hint=again)
    if time.time() - float(search.get("t") or 0) > CACHE_MAX_AGE_S:
        raise UsageError(f"the `capacity offerings` list with {offering_id} is over a day old", hint=again)
    if region and region != search.get("region"):
        raise UsageError(f"offering {offering_id} was listed in {search.get('region')}, not --region {region}")
    aws = Aws(region=search.get("region"), profile=profile)
    query = Query(**{k: v for k, v in search["query"].items() if k in Query.__dataclass_fields__})
    for offering in offerings(aws, query):
        if offering.id == offering_id:
            return aws, offering
    raise ProviderError(f"offering {offering_id} is no longer offered (EC2 no longer lists it); nothing was bought",
                        hint="run `clustertool capacity offerings` again and pick another")


def describe(offering: Offering) -> str:
    """One line: what it is and what it costs."""
    per_node = offering.per_node_hour
    return (f"{offering.id}: {offering.count} x {offering.instance_type} in {offering.az}, {utc(offering.start)} to "
            f"{utc(offering.end)} ({offering.hours} h), {offering.fee:,.2f} {offering.currency} upfront"
            + (f" ({per_node:,.2f} {offering.currency} per instance-hour)" if per_node is not None else ""))
