"""Hourly prices: an on-demand table for common GPU types (approximate us-east-1 Linux list
prices as published by AWS; they change, and differ by region) and spot from
``describe_spot_price_history``."""

from __future__ import annotations

import datetime
import time
from typing import Any

from clustertool.providers.aws.client import Aws

BASIS = "approximate us-east-1 on-demand"

ON_DEMAND_USD: dict[str, float] = {
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48, "p3dn.24xlarge": 31.212,
    "p4d.24xlarge": 32.7726, "p4de.24xlarge": 40.9657, "p5.48xlarge": 98.32,
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352, "g4dn.metal": 7.824,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016, "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    # CPU types for reduction servers (network-optimized)
    "c6in.4xlarge": 0.9072, "c6in.8xlarge": 1.8144, "c6in.16xlarge": 3.6288, "c6in.32xlarge": 7.2576,
    "c5n.9xlarge": 1.944, "c5n.18xlarge": 3.888, "c7gn.8xlarge": 1.9968, "c7gn.16xlarge": 3.9936,
}


def on_demand(instance_type: str) -> float | None:
    return ON_DEMAND_USD.get(instance_type)


def spot(aws: Aws, instance_type: str, az: str | None = None) -> float | None:
    """The latest Linux spot price for the type (in ``az`` when given); None when unknown."""
    from botocore.exceptions import ClientError

    kwargs: dict[str, Any] = {
        "InstanceTypes": [instance_type], "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
        "StartTime": datetime.datetime.now(datetime.timezone.utc), "MaxResults": 20}
    if az:
        kwargs["AvailabilityZone"] = az
    try:
        history = aws.call("describe_spot_price_history", **kwargs).get("SpotPriceHistory", [])
    except ClientError:
        return None
    prices = [float(h["SpotPrice"]) for h in history if h.get("SpotPrice")]
    return max(prices) if prices else None


def hourly(instance_type: str, count: int, *, spot_price: float | None = None,
           is_spot: bool = False) -> tuple[float | None, str]:
    """(USD per hour for the cluster, how the figure was made)."""
    if is_spot:
        if spot_price is None:
            return None, f"spot price of {instance_type} unknown"
        return spot_price * count, f"{count} x {instance_type} at the current spot price ${spot_price:.4f}/h"
    each = on_demand(instance_type)
    if each is None:
        return None, f"no price known for {instance_type} (not in clustertool's table)"
    return each * count, f"{count} x {instance_type} at ${each:.4f}/h, {BASIS}"


def describe_hourly(instance_type: str, count: int, *, spot_price: float | None = None,
                    is_spot: bool = False) -> str:
    total, basis = hourly(instance_type, count, spot_price=spot_price, is_spot=is_spot)
    return f"${total:,.2f}/h ({basis})" if total is not None else basis


def cost_so_far(per_hour: float | None, since: float, now: float | None = None) -> str:
    if per_hour is None or not since:
        return "unknown"
    hours = max(0.0, ((now or time.time()) - since) / 3600.0)
    return f"${per_hour * hours:,.2f} over {hours:.1f} h since launch (if it ran all that time)"
