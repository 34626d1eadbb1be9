"""Quotas before creation: the request against the account's vCPU quota for the instance family.

EC2 limits running instances per family in vCPUs ("Running On-Demand P instances": every
p2/p3/p4/p5 together).  The quota comes from Service Quotas (the applied value, else the AWS
default); where Service Quotas cannot answer (no permission, an emulator without it), from the
EC2 account attribute ``max-instances`` - which AWS documents as no longer the real limit, so
then the check is only a coarse instance count, and the plan says so.  What already runs in the
family counts against the quota too.  ``--skip-quota-check`` leaves the decision to RunInstances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustertool.core.errors import ProviderError
from clustertool.providers.aws import capacity, instances
from clustertool.providers.aws.client import Aws, EndpointLacksApi

# family letters -> (on-demand quota, spot quota), each (code, name)
ON_DEMAND = {
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "trn": ("L-2C3B7624", "Running On-Demand Trn instances"),
    "dl": ("L-6E869C2A", "Running On-Demand DL instances"),
    "f": ("L-74FC7D96", "Running On-Demand F instances"),
    "x": ("L-7295265B", "Running On-Demand X instances"),
    "hpc": ("L-F7808C92", "Running On-Demand HPC instances"),
    "standard": ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}
SPOT = {
    "p": ("L-7212CCBC", "All P Spot Instance Requests"),
    "g": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    "inf": ("L-B5D1601B", "All Inf Spot Instance Requests"),
    "trn": ("L-6B0D517C", "All Trn Spot Instance Requests"),
    "standard": ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
_ALIASES = {"vt": "g", "gr": "g"}
_LEADING = re.compile(r"^[a-z]+")


@dataclass
class Quota:
    limit: float  # vCPUs (or instances, for the EC2 attribute)
    unit: str  # 'vCPUs' | 'instances'
    name: str
    source: str
    used: float
    need: float

    def fits(self) -> bool:
        return self.used + self.need <= self.limit

    def describe(self) -> str:
        return (f"{self.name}: {self.limit:,.0f} {self.unit} ({self.source}), {self.used:,.0f} in use, "
                f"this cluster needs {self.need:,.0f}")


def family(instance_type: str) -> str:
    """The quota class of a type: 'p4d.24xlarge' -> 'p', 'vt1.3xlarge' -> 'g', 'm5.large' -> 'standard'."""
    head = _LEADING.match(instance_type.split(".")[0].lower())
    letters = head.group(0) if head else ""
    letters = _ALIASES.get(letters, letters)
    if letters in ON_DEMAND:
        return letters
    if letters.startswith("u") or letters == "mac":
        return letters  # high memory / mac: dedicated hosts, not checked here
    return "standard"


def quota_code(instance_type: str, spot: bool) -> tuple[str, str] | None:
    return (SPOT if spot else ON_DEMAND).get(family(instance_type))


def _service_quota(aws: Aws, code: str) -> tuple[float, str] | None:
    """(value, source) from Service Quotas: the applied value, else the default; None if it cannot say."""
    from botocore.exceptions import ClientError

    for op, source in (("get_service_quota", "Service Quotas"), ("get_aws_default_service_quota",
                                                                  "Service Quotas default")):
        try:
            answer = aws.call(op, service="service-quotas", ServiceCode="ec2", QuotaCode=code)
        except (ClientError, EndpointLacksApi):  # NoSuchResource, AccessDenied, not implemented
            continue
        value = answer.get("Quota", {}).get("Value")
        if value is not None:
            return float(value), source
    return None


def _max_instances(aws: Aws) -> float | None:
    from botocore.exceptions import ClientError

    try:
        attrs = aws.call("describe_account_attributes", AttributeNames=["max-instances"]).get("AccountAttributes", [])
    except (ClientError, EndpointLacksApi):
        return None
    for attr in attrs:
        if attr.get("AttributeName") == "max-instances":
            for value in attr.get("AttributeValues", []):
                try:
                    return float(value.get("AttributeValue"))
                except (TypeError, ValueError):
                    continue
    return None


def _running(aws: Aws, spot: bool) -> list[dict]:
    running = instances.describe(aws, filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for i in running if (i.get("InstanceLifecycle") == "spot") == spot]


def _vcpus_in_family(aws: Aws, running: list[dict], fam: str) -> float:
    types = sorted({i.get("InstanceType", "") for i in running if family(i.get("InstanceType", "")) == fam})
    vcpus = {t: capacity.type_info(aws, t).vcpus for t in types if t}
    return float(sum(vcpus.get(i.get("InstanceType", ""), 0) for i in running))


def lookup(aws: Aws, info: capacity.TypeInfo, count: int, spot: bool) -> Quota | None:
    """The quota this request counts against, with what already runs; None when nothing can say."""
    code = quota_code(info.name, spot)
    if code is None:
        return None  # dedicated-host families and the rarer spot classes: RunInstances decides
    found = _service_quota(aws, code[0])
    if found is not None:
        running = _running(aws, spot)
        return Quota(found[0], "vCPUs", f"{code[1]} ({code[0]})", found[1],
                     _vcpus_in_family(aws, running, family(info.name)), float(info.vcpus * count))
    limit = _max_instances(aws)
    if limit is None:
        return None
    return Quota(limit, "instances", "running instances", "EC2 account attribute max-instances; "
                 "Service Quotas gave no answer", float(len(_running(aws, spot))), float(count))


def check(aws: Aws, info: capacity.TypeInfo, count: int, spot: bool) -> Quota | None:
    """Refuse in one line, before anything is made, a request the quota cannot hold."""
    quota = lookup(aws, info, count, spot)
    if quota is not None and not quota.fits():
        free = max(0.0, quota.limit - quota.used)
        raise ProviderError(f"--nodes {count} x {info.name} needs {quota.need:,.0f} {quota.unit}, but the quota "
                            f"{quota.name} in {aws.region} is {quota.limit:,.0f} with {quota.used:,.0f} in use "
                            f"({free:,.0f} free; {quota.source})",
                            hint="use fewer --nodes, ask for more in the Service Quotas console, or "
                                 "--skip-quota-check to let RunInstances decide")
    return quota
