"""Remove what a cluster made, found by its id tag (and its state), in dependency order:
instances (wait until terminated), their network interfaces, Elastic IPs, placement groups,
security groups, key pairs.

Idempotent: anything already gone is skipped; AWS's "in use" answers while instances are still
shutting down are retried until the wait timeout.  Between two deletes a SIGTERM/SIGHUP that
arrived meanwhile ends the run (``interrupts.checkpoint``): the state still says what is left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clustertool.core import interrupts
from clustertool.core.errors import ProviderError
from clustertool.core.model import ClusterRecord, Reporter
from clustertool.providers.aws import placement, tags
from clustertool.providers.aws.client import Aws, aws_errors, error_message, is_code, poll_interval, wait_timeout
from clustertool.providers.aws.instances import describe, state_of, tagged_by, wait_for_state

GONE = {"placement_group": ("InvalidPlacementGroup.Unknown", "InvalidPlacementGroup.NotFound"),
        "security_group": ("InvalidGroup.NotFound", "InvalidGroupId.NotFound"),
        "key_pair": ("InvalidKeyPair.NotFound",),
        "network_interface": ("InvalidNetworkInterfaceID.NotFound", "InvalidNetworkInterfaceId.NotFound"),
        "address": ("InvalidAllocationID.NotFound", "InvalidAddress.NotFound")}
BUSY = ("DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidGroup.InUse", "ResourceInUse",
        "InvalidNetworkInterface.InUse", "InvalidIPAddress.InUse")


@dataclass
class Owned:
    """What to remove, by kind."""

    instances: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    key_pairs: list[str] = field(default_factory=list)
    network_interfaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)  # allocation ids

    def empty(self) -> bool:
        return not (self.instances or self.placement_groups or self.security_groups or self.key_pairs
                    or self.network_interfaces or self.addresses)


def _merge(*lists) -> list[str]:
    out: list[str] = []
    for items in lists:
        for item in items or []:
            if item and item not in out:
                out.append(item)
    return out


def owned(aws: Aws, cluster: ClusterRecord) -> Owned:
    """Everything tagged with the cluster's id plus everything its state recorded (adopted machines
    excluded unless the user asked to terminate them)."""
    ps = cluster.provider_state
    stamp = tags.Stamp(cluster.name, cluster.id)
    flt = stamp.filter()
    mine = lambda items, key, tag_key="Tags": [i[key] for i in items if stamp.owns(i.get(tag_key))]  # noqa: E731
    adopted = list(ps.get("adopted", []))
    recorded = [i["InstanceId"] for i in describe(aws, ps.get("instances", []))
                if state_of(i) != "terminated"] if ps.get("instances") else []
    ids = _merge(mine(tagged_by(aws, flt), "InstanceId"), recorded)
    ids = [i for i in ids if i not in adopted]
    if cluster.terminate_adopted and adopted:
        ids += [i["InstanceId"] for i in describe(aws, adopted) if state_of(i) != "terminated"]
    return Owned(
        instances=ids,
        placement_groups=_merge(mine(placement.tagged_by(aws, flt), "GroupName"), ps.get("placement_groups")),
        security_groups=_merge(mine(tagged_security_groups(aws, flt), "GroupId"), ps.get("security_groups")),
        key_pairs=_merge(mine(tagged_key_pairs(aws, flt), "KeyName"), ps.get("key_pairs")),
        network_interfaces=mine(tagged_interfaces(aws, flt), "NetworkInterfaceId", "TagSet"),
        addresses=_merge(mine(tagged_addresses(aws, flt), "AllocationId"), ps.get("addresses")),
    )


def tagged_security_groups(aws: Aws, filters: list[dict]) -> list[dict]:
    with aws_errors("listing security groups"):
        return aws.paginate("describe_security_groups", "SecurityGroups", Filters=filters)


def tagged_key_pairs(aws: Aws, filters: list[dict]) -> list[dict]:
    with aws_errors("listing key pairs"):
        return aws.call("describe_key_pairs", Filters=filters).get("KeyPairs", [])


def tagged_interfaces(aws: Aws, filters: list[dict]) -> list[dict]:
    with aws_errors("listing network interfaces"):
        return aws.paginate("describe_network_interfaces", "NetworkInterfaces", Filters=filters)


def tagged_addresses(aws: Aws, filters: list[dict]) -> list[dict]:
    with aws_errors("listing Elastic IPs"):
        return aws.call("describe_addresses", Filters=filters).get("Addresses", [])


def interfaces_left(aws: Aws, what: Owned) -> list[str]:
    """Interfaces still there after the instances went: tagged ones, those of the cluster's instances
    and those in its security groups (an interface in a group keeps the group from being deleted)."""
    found = list(what.network_interfaces)
    for name, values in (("attachment.instance-id", what.instances), ("group-id", what.security_groups)):
        for start in range(0, len(values), 200):
            batch = [{"Name": name, "Values": values[start:start + 200]}]
            found += [e["NetworkInterfaceId"] for e in tagged_interfaces(aws, batch)]
    return _merge(found)


def remove(aws: Aws, what: Owned, report: Reporter) -> list[str]:
    """Terminate and wait, then delete interfaces, addresses, groups and keys; returns lines saying what
    went (``report`` gets the progress in between)."""
    lines: list[str] = []
    done = lines.append
    interrupts.checkpoint()  # a signal that came while the cluster was looked up: nothing deleted yet
    if what.instances:
        terminate_and_wait(aws, what.instances, report)
        done(f"terminated {len(what.instances)} instance(s): {', '.join(what.instances)}")
    deadline = time.monotonic() + wait_timeout()
    for eni in interfaces_left(aws, what):
        if _delete_interface(aws, eni, deadline):
            done(f"deleted network interface {eni}")
    for allocation in what.addresses:
        if delete_resource(aws, "address", allocation, deadline, op="release_address", AllocationId=allocation):
            done(f"released Elastic IP {allocation}")
    for name in what.placement_groups:
        if delete_resource(aws, "placement_group", name, deadline, GroupName=name):
            done(f"deleted placement group {name}")
    for gid in what.security_groups:
        if delete_resource(aws, "security_group", gid, deadline, GroupId=gid):
            done(f"deleted security group {gid}")
    for name in what.key_pairs:
        if delete_resource(aws, "key_pair", name, deadline, KeyName=name):
            done(f"deleted key pair {name}")
    return lines


def terminate_and_wait(aws: Aws, ids: list[str], report: Reporter) -> None:
    from botocore.exceptions import ClientError

    report(f"terminating {len(ids)} instance(s) and waiting until they are gone")
    for start in range(0, len(ids), 500):
        batch = ids[start:start + 500]
        try:
            aws.call("terminate_instances", InstanceIds=batch)
        except ClientError as exc:
            if not is_code(exc, "InvalidInstanceID"):
                with aws_errors("terminating instances"):
                    raise
            live = [i["InstanceId"] for i in describe(aws, batch) if state_of(i) != "terminated"]
            if live:
                with aws_errors("terminating instances"):
                    aws.call("terminate_instances", InstanceIds=live)
        interrupts.checkpoint()
    wait_for_state(aws, ids, {"terminated"}, what="terminated")


def _delete_interface(aws: Aws, eni: str, deadline: float) -> bool:
    """An interface left attached to a terminated instance is detached first (AWS normally deletes
    interfaces with their instance; EFA interfaces on secondary cards are the ones that linger)."""
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_network_interfaces", NetworkInterfaceIds=[eni]).get("NetworkInterfaces", [])
    except ClientError as exc:
        if is_code(exc, *GONE["network_interface"]):
            return False
        with aws_errors(f"describing network interface {eni}"):
            raise
    if not found:
        return False
    attachment = found[0].get("Attachment") or {}
    if found[0].get("Status") == "in-use" and attachment.get("AttachmentId") and attachment.get("DeviceIndex") != 0:
        try:
            aws.call("detach_network_interface", AttachmentId=attachment["AttachmentId"], Force=True)
        except ClientError as exc:
            if not is_code(exc, "InvalidAttachmentID", "OperationNotPermitted", *GONE["network_interface"]):
                with aws_errors(f"detaching network interface {eni}"):
                    raise
    return delete_resource(aws, "network_interface", eni, deadline, NetworkInterfaceId=eni)


def delete_resource(aws: Aws, kind: str, rid: str, deadline: float, op: str | None = None, **kwargs) -> bool:
    """Delete one resource; False when it was already gone; retries while it is still in use."""
    from botocore.exceptions import ClientError

    interrupts.checkpoint()
    op = op or f"delete_{kind}"
    if kind == "key_pair" and not _key_exists(aws, rid):  # DeleteKeyPair succeeds on missing keys
        return False
    while True:
        try:
            aws.call(op, **kwargs)
            return True
        except ClientError as exc:
            if is_code(exc, *GONE[kind]):
                return False
            if not is_code(exc, *BUSY):
                with aws_errors(f"deleting {kind.replace('_', ' ')} {rid}"):
                    raise
            if time.monotonic() >= deadline:
                raise ProviderError(f"{kind.replace('_', ' ')} {rid} still in use after waiting: {error_message(exc)}",
                                    hint="run `clustertool down` again in a minute") from None
            time.sleep(poll_interval())
            interrupts.checkpoint()


def _key_exists(aws: Aws, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        return bool(aws.call("describe_key_pairs", KeyNames=[name]).get("KeyPairs"))
    except ClientError as exc:
        if is_code(exc, "InvalidKeyPair"):
            return False
        with aws_errors(f"describing key pair {name}"):
            raise


def clean_attempt(aws: Aws, cluster: ClusterRecord, az: str, group: str | None, report: Reporter) -> None:
    """Undo one failed launch attempt: its instances in ``az`` (if any got made) and its placement group."""
    stamp = tags.Stamp(cluster.name, cluster.id)
    leftovers = [i["InstanceId"] for i in tagged_by(aws, stamp.filter())
                 if i.get("Placement", {}).get("AvailabilityZone") == az and stamp.owns(i.get("Tags"))]
    for line in remove(aws, Owned(instances=leftovers, placement_groups=[group] if group else []), report):
        report(line)
    for iid in leftovers:
        if iid in cluster.provider_state.get("instances", []):
            cluster.provider_state["instances"].remove(iid)
