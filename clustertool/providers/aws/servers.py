"""Reduction servers on AWS: K CPU instances beside the GPU nodes, in the same attempt.

They go in the AZ, subnet, security group and placement group of the GPU nodes' attempt, by a
second RunInstances right after the GPU nodes' one; a capacity error on either retreats from
the whole attempt (the zone's instances and placement group go), so `up` stays all or nothing.
They carry the cluster's identity tags like every node (teardown, status and sweeps find them by
the id) and ``clustertool:role=server``, ``clustertool:server=<j>``, ``Name=<cluster>-server-<j>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord
from clustertool.providers.aws import capacity, pricing, quota, tags
from clustertool.providers.aws.client import Aws, aws_errors
from clustertool.providers.aws.instances import SERVER_TAG

DEFAULT_TYPE = "c6in.8xlarge"  # network-optimized: 32 vCPUs, 50 Gbit/s
ROLE = "server"


@dataclass
class ServerPlan:
    count: int
    info: capacity.TypeInfo
    limits: quota.Quota | None = None


def count(options: dict) -> int:
    value = options.get("reduction_servers") or 0
    if not isinstance(value, int) or value < 0:
        raise UsageError(f"--reduction-servers: expected 0 or a positive integer, got {value!r}")
    return value


def server_type(options: dict) -> str:
    return options.get("server_type") or DEFAULT_TYPE


def prepare(aws: Aws, options: dict, azs: list[str]) -> tuple[ServerPlan | None, list[str]]:
    """The servers' type and quota; the zones to try narrowed to those offering both types."""
    k = count(options)
    if not k:
        if options.get("server_type"):
            raise UsageError("--server-type goes with --reduction-servers K")
        return None, azs
    info = capacity.type_info(aws, server_type(options))
    offered = set(capacity.offered_azs(aws, info.name))
    both = [az for az in azs if az in offered]
    if not both:
        raise UsageError(f"no Availability Zone among {', '.join(azs)} offers the server type {info.name}",
                         hint="pick another --server-type (e.g. c5n.9xlarge), --az or --region")
    limits = None if options.get("skip_quota_check") else quota.check(aws, info, k, bool(options.get("spot")))
    return ServerPlan(k, info, limits), both


def launch_options(options: dict) -> dict:
    """The GPU nodes' options for the servers' RunInstances: no EFA (a CPU type may lack it), not into
    the GPU nodes' capacity block (it holds their type only)."""
    return {**options, "efa": False, "capacity_block": None, "capacity_reservation": None,
            "capacity_reservation_group": None, "reservations": None}


def tag(aws: Aws, cluster: str, instances: list[dict], workers: int) -> list[dict]:
    """server-1..K: role, index (after the workers'), server number and Name."""
    ordered = sorted(instances, key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))
    for j, inst in enumerate(ordered, start=1):
        values = {tags.ROLE: ROLE, tags.NODE: str(workers + j), SERVER_TAG: str(j), tags.NAME: f"{cluster}-server-{j}"}
        with aws_errors("tagging reduction servers"):
            aws.call("create_tags", Resources=[inst["InstanceId"]], Tags=tags.pairs(values))
        inst["Tags"] = [t for t in inst.get("Tags", []) if t["Key"] not in values] + tags.pairs(values)
    return ordered


def plan_lines(plan: ServerPlan | None, options: dict) -> list[str]:
    if plan is None:
        return []
    info = plan.info
    return [f"reduction servers: {plan.count} x {info.name} ({info.vcpus} vCPUs, "
            f"{'no GPUs' if not info.gpus else f'{info.gpus} GPU(s)'}) in the same zone, subnet, security group and "
            f"placement group, launched with the nodes (all or nothing); role server, not ranks (not in hostfiles)",
            "servers' quota: " + (plan.limits.describe() if plan.limits else "not checked")]


def hourly(cluster: ClusterRecord, is_spot: bool, spot_price: float | None = None) -> tuple[float | None, str] | None:
    """The servers' share of the hourly price, or None without servers."""
    k = sum(1 for n in cluster.nodes if n.is_server) or int(cluster.provider_state.get("servers") or 0)
    itype = cluster.provider_state.get("server_type") or ""
    if not k or not itype:
        return None
    return pricing.hourly(itype, k, spot_price=spot_price, is_spot=is_spot)


def combine(nodes: tuple[float | None, str], servers: tuple[float | None, str] | None) -> tuple[float | None, str]:
    """GPU nodes + servers: one total (None when either is unknown) and both bases."""
    if servers is None:
        return nodes
    total = None if nodes[0] is None or servers[0] is None else nodes[0] + servers[0]
    return total, f"{nodes[1]} + {servers[1]}"
