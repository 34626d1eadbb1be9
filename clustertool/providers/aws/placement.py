"""Cluster placement groups (strategy ``cluster``): one per launch attempt, in that attempt's AZ.

AWS places a cluster placement group's instances close together in one AZ (low latency,
high bandwidth between nodes).  The group is made per attempt so a retry in the next AZ
starts clean.
"""

from __future__ import annotations

from typing import Callable

from clustertool.core.model import Reporter, silent
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, EndpointLacksApi, aws_errors

Record = Callable[[str, str], None]


def group_name(cluster: str, az: str, suffix: str) -> str:
    return f"clustertool-{cluster}-{az}-{suffix}"


def create(aws: Aws, stamp: tags.Stamp, az: str, suffix: str, record: Record,
           report: Reporter = silent) -> str | None:
    """The attempt's group; None (launch without one) only where the endpoint lacks the API,
    as moto's server does - real EC2 implements it, and its errors stop the launch."""
    name = group_name(stamp.cluster, az, suffix)
    try:
        with aws_errors(f"creating placement group {name}"):
            aws.call("create_placement_group", GroupName=name, Strategy="cluster",
                     TagSpecifications=[stamp.spec("placement-group", name)])
    except EndpointLacksApi as exc:
        report(f"warning: {exc.message}; launching without a cluster placement group")
        return None
    record("placement_groups", name)
    return name


def tagged_by(aws: Aws, filters: list[dict]) -> list[dict]:
    """Placement groups matching tag ``filters``."""
    try:
        with aws_errors("listing placement groups"):
            return aws.call("describe_placement_groups", Filters=filters).get("PlacementGroups", [])
    except EndpointLacksApi:
        return []  # an endpoint without placement groups has none of ours
