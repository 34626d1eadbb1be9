"""Every clustertool-tagged resource of a region, grouped by the cluster (id) that made it, with its
owner, age and lease: what `up` checks a name against and what `down --sweep` lists."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clustertool.providers.aws import controller_iam, filesystems_down, lease, placement, pricing, tags, teardown
from clustertool.providers.aws.client import Aws
from clustertool.providers.aws.instances import tagged_by

KINDS = ("instance", "network-interface", "placement-group", "security-group", "key-pair", "address",
         "efs-file-system", "fsx-file-system", "iam-role", "iam-instance-profile")


@dataclass
class Found:
    """One cluster's resources in AWS, as its tags describe it."""

    name: str
    id: str  # '' for resources made before cluster ids
    owner: str = ""
    home: str = ""
    lease: str | float | None = None
    created: float | None = None
    resources: dict[str, list[str]] = field(default_factory=dict)
    instances: int = 0  # live ones
    billed: dict[str, int] = field(default_factory=dict)  # instance type -> how many are pending or running

    def per_hour(self) -> float | None:
        """What its running instances cost an hour, on demand (None: a type with no known price)."""
        total = 0.0
        for kind, count in self.billed.items():
            each = pricing.on_demand(kind)
            if each is None:
                return None
            total += each * count
        return total

    @property
    def key(self) -> str:
        return self.id or f"name:{self.name}"

    def age(self, now: float | None = None) -> float | None:
        return None if self.created is None else max(0.0, (time.time() if now is None else now) - self.created)

    def count(self) -> int:
        return sum(len(v) for v in self.resources.values())


def _created(values: dict[str, str], inst: dict | None) -> float | None:
    try:
        return float(values[tags.CREATED])
    except (KeyError, ValueError):
        pass
    launch = (inst or {}).get("LaunchTime")
    return launch.timestamp() if launch is not None and hasattr(launch, "timestamp") else None


def collect(aws: Aws, name: str | None = None, kinds: tuple[str, ...] = KINDS) -> dict[str, Found]:
    """Tagged resources (of clusters named ``name``, or of all), by cluster key."""
    flt = tags.cluster_filter(name) if name else tags.any_cluster_filter()
    groups: dict[str, Found] = {}
    leases: dict[str, list[str]] = {}

    def add(kind: str, rid: str, tag_list: list[dict] | None, inst: dict | None = None) -> None:
        values = tags.as_dict(tag_list)
        found = Found(values.get(tags.CLUSTER, ""), values.get(tags.ID, ""))
        found = groups.setdefault(found.key, found)
        found.owner = found.owner or values.get(tags.OWNER, "")
        found.home = found.home or values.get(tags.HOME, "")
        made = _created(values, inst)
        if made is not None and (found.created is None or made < found.created):
            found.created = made
        if tags.LEASE in values:
            leases.setdefault(found.key, []).append(values[tags.LEASE])
        found.resources.setdefault(kind, []).append(rid)
        if kind == "instance":
            found.instances += 1
            if (inst or {}).get("State", {}).get("Name") in ("pending", "running"):
                kind_ = (inst or {}).get("InstanceType", "?")
                found.billed[kind_] = found.billed.get(kind_, 0) + 1

    if "instance" in kinds:
        for inst in tagged_by(aws, flt):
            add("instance", inst["InstanceId"], inst.get("Tags"), inst)
    if "security-group" in kinds:
        for group in teardown.tagged_security_groups(aws, flt):
            add("security-group", group["GroupId"], group.get("Tags"))
    if "key-pair" in kinds:
        for key in teardown.tagged_key_pairs(aws, flt):
            add("key-pair", key["KeyName"], key.get("Tags"))
    if "placement-group" in kinds:
        for group in placement.tagged_by(aws, flt):
            add("placement-group", group["GroupName"], group.get("Tags"))
    if "network-interface" in kinds:
        for eni in teardown.tagged_interfaces(aws, flt):
            add("network-interface", eni["NetworkInterfaceId"], eni.get("TagSet"))
    if "address" in kinds:
        for address in teardown.tagged_addresses(aws, flt):
            add("address", address["AllocationId"], address.get("Tags"))
    for kind in ("efs", "fsx"):  # shared filesystems (filesystems.py); none where the identity may not list them
        if f"{kind}-file-system" in kinds:
            def ours(values: dict[str, str]) -> bool:
                return tags.CLUSTER in values and (name is None or values[tags.CLUSTER] == name)
            for fs in filesystems_down.tagged_file_systems(aws, kind, ours):
                add(f"{kind}-file-system", fs["FileSystemId"], fs.get("Tags"))
    if {"iam-role", "iam-instance-profile"} & set(kinds):  # a recovery controller's identity (controller_iam.py)
        for found_iam in controller_iam.tagged(aws):
            labels = tags.as_dict(found_iam["tags"])
            if found_iam["kind"] in kinds and (name is None or labels.get(tags.CLUSTER) == name):
                add(found_iam["kind"], found_iam["name"], found_iam["tags"])
    for cluster_key, values in leases.items():
        groups[cluster_key].lease = lease.summarize(values)
    return groups
