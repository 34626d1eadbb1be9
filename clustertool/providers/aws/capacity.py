"""What an instance type is (GPUs, EFA, architecture) and which Availability Zones offer it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clustertool.core.errors import ProviderError, UsageError
from clustertool.providers.aws.client import Aws, aws_errors, error_code, error_message, is_code

_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")


@dataclass
class TypeInfo:
    name: str
    gpus: int = 0
    gpu_name: str = ""
    efa: bool = False
    max_efa_interfaces: int = 0
    network_cards: int = 1
    vcpus: int = 0
    architectures: list[str] = field(default_factory=lambda: ["x86_64"])

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces a node gets with --efa: one per network card (p4d: 4, p5: 32), as AWS
        recommends for full bandwidth, within the type's EFA maximum."""
        if not self.efa:
            return 0
        return max(1, min(self.network_cards, self.max_efa_interfaces or 1))

    @property
    def arch(self) -> str:
        return "arm64" if "arm64" in self.architectures and "x86_64" not in self.architectures else "x86_64"


def check_type_name(name: str) -> str:
    if not _TYPE_RE.match(name or ""):
        raise UsageError(f"--instance-type: {name!r} is not an instance type name",
                         hint="e.g. p4d.24xlarge, p5.48xlarge, g5.12xlarge")
    return name


def type_info(aws: Aws, name: str) -> TypeInfo:
    """describe_instance_types for one type; an unknown type is a one-line usage error."""
    check_type_name(name)
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_instance_types", InstanceTypes=[name]).get("InstanceTypes", [])
    except ClientError as exc:
        if is_code(exc, "InvalidInstanceType", "InvalidParameterValue"):
            raise UsageError(f"unknown instance type {name!r} in {aws.region}",
                             hint="check the name (e.g. p4d.24xlarge) and that the region offers it") from None
        with aws_errors("describing the instance type"):
            raise
    if not found:
        raise UsageError(f"unknown instance type {name!r} in {aws.region}",
                         hint="check the name (e.g. p4d.24xlarge) and that the region offers it")
    return parse_type(found[0])


def parse_type(data: dict) -> TypeInfo:
    gpus = data.get("GpuInfo", {}).get("Gpus", [])
    network = data.get("NetworkInfo", {})
    return TypeInfo(
        name=data["InstanceType"],
        gpus=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_name=", ".join(f"{g.get('Manufacturer', '')} {g.get('Name', '')}".strip() for g in gpus),
        efa=bool(network.get("EfaSupported")),
        max_efa_interfaces=int(network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) or 0),
        network_cards=max(1, len(network.get("NetworkCards") or []) or int(network.get("MaximumNetworkCards") or 1)),
        vcpus=int(data.get("VCpuInfo", {}).get("DefaultVCpus", 0) or 0),
        architectures=list(data.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])),
    )


def offered_azs(aws: Aws, name: str) -> list[str]:
    """Availability Zones of the region that offer the type, in name order."""
    with aws_errors("listing instance type offerings"):
        offers = aws.paginate("describe_instance_type_offerings", "InstanceTypeOfferings",
                              LocationType="availability-zone",
                              Filters=[{"Name": "instance-type", "Values": [name]}])
    return sorted({o["Location"] for o in offers})


def az_order(aws: Aws, name: str, az: str | None = None) -> list[str]:
    """The AZs to try, in order: only ``az`` when given (it must offer the type), else all that do."""
    offered = offered_azs(aws, name)
    if not offered:
        raise UsageError(f"no Availability Zone of {aws.region} offers {name}",
                         hint="pick another --region or --instance-type")
    if az:
        if az not in offered:
            raise UsageError(f"--az {az} does not offer {name} "
                             f"(in {aws.region} it is offered in: {', '.join(offered)})",
                             hint="leave --az out to try every zone that offers it")
        return [az]
    return offered


def check_efa(info: TypeInfo) -> None:
    if not info.efa:
        raise UsageError(f"--efa: {info.name} does not support EFA",
                         hint="EFA needs types such as p4d.24xlarge, p5.48xlarge, g5.48xlarge; drop --efa otherwise")


def launch_failure(tried: list[tuple[str, str]], count: int, name: str) -> ProviderError:
    """One message listing every AZ tried and why it failed."""
    detail = "; ".join(f"{az}: {why}" for az, why in tried)
    return ProviderError(f"could not launch {count} x {name} together in any Availability Zone ({detail})",
                         hint="try later, another --region, fewer nodes, or raise the quota in Service Quotas")


def reason(exc: BaseException) -> str:
    return f"{error_code(exc) or type(exc).__name__}: {error_message(exc)}"
