"""Remove what a cluster made, found by its tags (and its state), in dependency order:
instances (wait until terminated), then placement groups, security groups, key pairs.

Idempotent: anything already gone is skipped; AWS's DependencyViolation answers while
instances are still shutting down are retried until the wait timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clustertool.errors import ProviderError
from clustertool.model import Cluster, Reporter
from clustertool.providers.aws import instances as inst_mod
from clustertool.providers.aws import placement, tags
from clustertool.providers.aws.client import Aws, aws_errors, error_message, is_code, poll_interval, wait_timeout

GONE = {"placement_group": ("InvalidPlacementGroup.Unknown", "InvalidPlacementGroup.NotFound"),
        "security_group": ("InvalidGroup.NotFound", "InvalidGroupId.NotFound"),
        "key_pair": ("InvalidKeyPair.NotFound",)}
BUSY = ("DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidGroup.InUse", "ResourceInUse")


@dataclass
class Owned:
    """What to remove, by kind."""

    instances: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    key_pairs: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.instances or self.placement_groups or self.security_groups or self.key_pairs)


def _merge(*lists) -> list[str]:
    out: list[str] = []
    for items in lists:
        for item in items or []:
            if item and item not in out:
                out.append(item)
    return out


def owned(aws: Aws, cluster: Cluster) -> Owned:
    """Everything tagged for the cluster plus everything its state recorded (adopted machines excluded
    unless the user asked to terminate them)."""
    ps = cluster.provider_state
    adopted = list(ps.get("adopted", []))
    recorded = [i["InstanceId"] for i in inst_mod.describe(aws, ps.get("instances", []))
                if inst_mod.state_of(i) != "terminated"] if ps.get("instances") else []
    ids = _merge([i["InstanceId"] for i in inst_mod.tagged(aws, cluster.name)], recorded)
    ids = [i for i in ids if i not in adopted]
    if cluster.options.get("terminate_adopted"):
        ids += [i["InstanceId"] for i in inst_mod.describe(aws, adopted) if inst_mod.state_of(i) != "terminated"] \
            if adopted else []
    return Owned(
        instances=ids,
        placement_groups=_merge([g["GroupName"] for g in placement.tagged(aws, cluster.name)],
                                ps.get("placement_groups")),
        security_groups=_merge([g["GroupId"] for g in tagged_security_groups(aws, cluster.name)],
                               ps.get("security_groups")),
        key_pairs=_merge([k["KeyName"] for k in tagged_key_pairs(aws, cluster.name)], ps.get("key_pairs")),
    )


def tagged_security_groups(aws: Aws, cluster: str | None) -> list[dict]:
    filters = tags.cluster_filter(cluster) if cluster else tags.any_cluster_filter()
    with aws_errors("listing security groups"):
        return aws.paginate("describe_security_groups", "SecurityGroups", Filters=filters)


def tagged_key_pairs(aws: Aws, cluster: str | None) -> list[dict]:
    filters = tags.cluster_filter(cluster) if cluster else tags.any_cluster_filter()
    with aws_errors("listing key pairs"):
        return aws.call("describe_key_pairs", Filters=filters).get("KeyPairs", [])


def remove(aws: Aws, what: Owned, report: Reporter) -> list[str]:
    """Terminate and wait, then delete groups and keys; returns lines saying what went."""
    lines: list[str] = []
    if what.instances:
        terminate_and_wait(aws, what.instances, report)
        lines.append(f"terminated {len(what.instances)} instance(s): {', '.join(what.instances)}")
    deadline = time.monotonic() + wait_timeout()
    for name in what.placement_groups:
        if _delete(aws, "placement_group", name, deadline, GroupName=name):
            lines.append(f"deleted placement group {name}")
    for gid in what.security_groups:
        if _delete(aws, "security_group", gid, deadline, GroupId=gid):
            lines.append(f"deleted security group {gid}")
    for name in what.key_pairs:
        if _delete(aws, "key_pair", name, deadline, KeyName=name):
            lines.append(f"deleted key pair {name}")
    for line in lines:
        report(line)
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
            live = [i["InstanceId"] for i in inst_mod.describe(aws, batch) if inst_mod.state_of(i) != "terminated"]
            if live:
                with aws_errors("terminating instances"):
                    aws.call("terminate_instances", InstanceIds=live)
    inst_mod.wait_for_state(aws, ids, {"terminated"}, what="terminated")


def _delete(aws: Aws, kind: str, rid: str, deadline: float, **kwargs) -> bool:
    """Delete one resource; False when it was already gone; retries while it is still in use."""
    from botocore.exceptions import ClientError

    op = f"delete_{kind}"
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


def _key_exists(aws: Aws, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        return bool(aws.call("describe_key_pairs", KeyNames=[name]).get("KeyPairs"))
    except ClientError as exc:
        if is_code(exc, "InvalidKeyPair"):
            return False
        with aws_errors(f"describing key pair {name}"):
            raise


def clean_attempt(aws: Aws, cluster: Cluster, az: str, group: str | None, report: Reporter) -> None:
    """Undo one failed launch attempt: its instances in ``az`` (if any got made) and its placement group."""
    leftovers = [i["InstanceId"] for i in inst_mod.tagged(aws, cluster.name)
                 if i.get("Placement", {}).get("AvailabilityZone") == az]
    remove(aws, Owned(instances=leftovers, placement_groups=[group] if group else []), report)
    for iid in leftovers:
        if iid in cluster.provider_state.get("instances", []):
            cluster.provider_state["instances"].remove(iid)
