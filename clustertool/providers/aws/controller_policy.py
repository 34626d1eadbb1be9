"""The recovery controller's rights on AWS, as data: the role's trust policy, and one inline policy that
allows what `replace` calls and nothing else, each write only on this cluster's own resources.

What `replace` calls (relaunch.py, and through it instances.py, teardown.py, capacity.py, network.py,
owner.py), and how each call is scoped here (IAM's Service Authorization Reference for EC2 says which
actions take resource-level permissions; those that do not need ``Resource: "*"``):

======================================  ===================================================================
DescribeInstances, DescribeInstanceStatus, DescribeInstanceTypes, DescribeSubnets, DescribeSecurityGroups
                                        read-only; EC2 scopes none of them by resource or tag: ``"*"``, in the
                                        cluster's region only (``aws:RequestedRegion``)
DescribeInstanceAttribute, GetConsoleOutput
                                        instances tagged ``clustertool:id=<this cluster>`` only (an instance's
                                        user data and console are not anyone else's to read)
RunInstances                            the new instance, its volume and its interface must be tagged with the
                                        cluster's id in the request (``aws:RequestTag``); it may use only the
                                        cluster's subnets, security groups, key pair, placement groups, images
                                        (and capacity reservations), named one by one
CreateTags                              only as part of that RunInstances (``ec2:CreateAction``); with
                                        ``keep_old`` also on the cluster's own instances, and then only the
                                        ``replaced-by``, role and Name keys (never the id: nothing foreign can
                                        be pulled into the cluster's scope)
TerminateInstances (StopInstances with ``keep_old``)
                                        instances tagged with the cluster's id
AssociateAddress                        the leader's own Elastic IP(s), onto an interface or instance tagged
                                        with the cluster's id
sts:GetCallerIdentity                   needs no permission (IAM never denies it)
======================================  ===================================================================

No ``iam:`` action at all, so no ``iam:PassRole`` either: a replaced node is launched without an instance
profile (`replace` passes none), and only the node that runs the controller holds this one.  When that node
itself is replaced, the user's own credentials associate the profile with its successor (controller_iam.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable

from clustertool.providers.aws import tags

PATH = "/clustertool/"  # every role and instance profile of a controller lives under this path (sweeps list it)
POLICY_NAME = "clustertool-replace"
VERSION = "2012-10-17"
UNSCOPED_READS = ("ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypes",
                  "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups")
OWN_READS = ("ec2:DescribeInstanceAttribute", "ec2:GetConsoleOutput")
KEEP_OLD_TAG_KEYS = ("clustertool:replaced-by", tags.ROLE, tags.NAME)  # relaunch._retire's tags on a kept instance
LAUNCHED = ("instance", "volume", "network-interface")  # what RunInstances makes, each tagged at launch


@dataclass(frozen=True)
class Names:
    role: str
    profile: str
    policy: str = POLICY_NAME


def names(cluster_id: str) -> Names:
    """The role's and the instance profile's names: one per cluster (IAM allows 64 characters in a role name)."""
    base = f"clustertool-ctl-{cluster_id}"
    if len(base) > 64:
        base = f"{base[:55]}-{hashlib.sha1(cluster_id.encode()).hexdigest()[:8]}"
    return Names(base, base)


@dataclass(frozen=True)
class Scope:
    """Everything the policy names: the cluster, where it is, and the parts a replacement may use."""

    cluster_id: str
    region: str
    account: str
    partition: str = "aws"
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    key_pairs: tuple[str, ...] = ()
    placement_groups: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    capacity_reservations: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()  # the leader's Elastic IP allocation ids (--access leader)
    spot: bool = False
    keep_old: bool = False

    def arn(self, kind: str, rid: str = "*", account: bool = True) -> str:
        return f"arn:{self.partition}:ec2:{self.region}:{self.account if account else ''}:{kind}/{rid}"


def is_controller_of(arn: str, cluster_id: str) -> bool:
    """Whether ``arn`` (STS's caller, an assumed role's session name and all) is this cluster's controller:
    the node holding its instance profile acts for the cluster's owner (owner.confirm lets it)."""
    parts = (arn or "").split(":", 5)
    return (bool(cluster_id) and len(parts) == 6 and parts[2] == "sts"
            and parts[5].split("/")[:2] == ["assumed-role", names(cluster_id).role])


def trust_policy() -> dict:
    """Only EC2 may take the role (for the instance that holds the profile)."""
    return {"Version": VERSION, "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                               "Action": "sts:AssumeRole"}]}


def _own(scope: Scope) -> dict:
    return {"StringEquals": {f"aws:ResourceTag/{tags.ID}": scope.cluster_id}}


def _statement(sid: str, actions: Iterable[str], resources: Iterable[str], condition: dict | None = None) -> dict:
    found: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": sorted(actions), "Resource": list(resources)}
    if condition:
        found["Condition"] = condition
    return found


def _parts(scope: Scope) -> list[str]:
    """What a new instance may be launched with: the cluster's own parts, one by one."""
    parts = [scope.arn("subnet", s) for s in scope.subnets]
    parts += [scope.arn("security-group", g) for g in scope.security_groups]
    parts += [scope.arn("key-pair", k) for k in scope.key_pairs]
    parts += [scope.arn("placement-group", p) for p in scope.placement_groups]
    parts += [scope.arn("image", i, account=False) for i in scope.images]
    parts += [scope.arn("capacity-reservation", r) for r in scope.capacity_reservations]
    if scope.spot:  # a one-time spot launch makes a spot request, which the launch does not tag
        parts.append(scope.arn("spot-instances-request"))
    return parts


def policy_document(scope: Scope) -> dict:
    """The controller's whole policy (see the module doc for why each statement is there)."""
    if not scope.cluster_id:
        raise ValueError("a controller's policy needs the cluster's id (a state from before ids has none)")
    if not (scope.subnets and scope.images and scope.security_groups):
        raise ValueError("a controller's policy needs the cluster's subnet, security group and image")
    instances = scope.arn("instance")
    launched = [scope.arn(kind) for kind in LAUNCHED]
    statements = [
        _statement("ReadAnywhereInTheRegion", UNSCOPED_READS, ["*"],
                   {"StringEquals": {"aws:RequestedRegion": scope.region}}),
        _statement("ReadOwnInstances", OWN_READS, [instances], _own(scope)),
        _statement("LaunchOnlyTaggedAsTheCluster", ["ec2:RunInstances"], launched,
                   {"StringEquals": {f"aws:RequestTag/{tags.ID}": scope.cluster_id}}),
        _statement("LaunchWithTheClustersParts", ["ec2:RunInstances"], _parts(scope)),
        _statement("TagOnlyWhileLaunching", ["ec2:CreateTags"], launched,
                   {"StringEquals": {"ec2:CreateAction": "RunInstances",
                                     f"aws:RequestTag/{tags.ID}": scope.cluster_id}}),
        _statement("RemoveOwnInstances", ["ec2:TerminateInstances"], [instances], _own(scope)),
    ]
    if scope.keep_old:
        statements.append(_statement("KeepTheOldInstanceStopped", ["ec2:StopInstances"], [instances], _own(scope)))
        statements.append(_statement("MarkTheOldInstanceReplaced", ["ec2:CreateTags"], [instances], {
            **_own(scope), "ForAllValues:StringEquals": {"aws:TagKeys": list(KEEP_OLD_TAG_KEYS)}}))
    if scope.addresses:
        statements.append(_statement(
            "MoveTheLeadersAddress", ["ec2:AssociateAddress"],
            [scope.arn("elastic-ip", a) for a in scope.addresses] + [scope.arn("network-interface"), instances],
            _own(scope)))
    return {"Version": VERSION, "Statement": statements}


def actions(document: dict) -> set[str]:
    """Every action a policy document allows."""
    return {a for s in document["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
