"""The recovery controller's identity on AWS: an IAM role that only EC2 can take, with one inline policy
(controller_policy.py: what `replace` calls, only on this cluster's tagged resources), in an instance
profile associated with the node that runs the controller.  No key ever reaches a node: boto3 on that node
takes the profile's short-lived credentials from the instance metadata.

Made with the user's own credentials (:func:`make`), all or nothing: the names are fixed by the cluster's
id and recorded in the state (and saved) before the first call, so a SIGKILL at any point leaves `down`
(:func:`remove`) what it needs to find everything; any error or signal on the way removes what was made.
Role and profile live under the path ``/clustertool/`` and carry the cluster's tags, so `down --sweep` finds
those of a lost state (:func:`tagged`, :func:`remove_found`).  The policy is inline: it goes with its role,
and no managed policy is left to leak.

IAM calls need ``iam:CreateRole``, ``PutRolePolicy``, ``CreateInstanceProfile``, ``AddRoleToInstanceProfile``,
``TagRole``, ``TagInstanceProfile``, ``PassRole`` (for the association) and the matching deletes, for the
user who runs `up --controller`; never for the controller.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable

from clustertool.core import interrupts, nodeset
from clustertool.core.errors import NotSupported, ProviderError, ToolError, UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent
from clustertool.providers.aws import controller_policy, instances, tags
from clustertool.providers.aws.client import (
    DENIED_CODES,
    Aws,
    EndpointLacksApi,
    aws_errors,
    error_code,
    error_message,
    poll_interval,
    wait_timeout,
)
from clustertool.providers.aws.controller_policy import PATH, Names, Scope

RECORD = "controller_identity"  # provider_state: {node, instance, role, profile, policy, keep_old, association}
ROLE_TAG = "controller"
GONE = ("NoSuchEntity", "InvalidAssociationID.NotFound", "InvalidInstanceID.NotFound")
NOT_YET = "Invalid IAM Instance Profile"  # EC2 sees a new profile only seconds later (IAM: eventually consistent)


def make(aws: Aws, cluster: ClusterRecord, node: str, *, keep_old: bool = False, report: Reporter = silent,
         save: Callable[[], None] = lambda: None) -> list[str]:
    """Role, policy and instance profile for ``cluster``, associated with ``node``'s instance; lines saying
    what was made.  Any failure or signal on the way removes what was made and re-raises.  One already
    complete on that node is kept; a half-made one (a killed run) is removed first."""
    done = cluster.provider_state.get(RECORD) or {}
    target = _target(cluster, node)
    if done.get("association") and done.get("node") == target.name and done.get("keep_old") == keep_old:
        return [f"the controller's role {done['role']} is already on {target.name}"]
    try:
        remove(aws, cluster, report, save)
        _refuse_foreign_profile(aws, target)
        scope = scope_for(aws, cluster, keep_old)
        made = controller_policy.names(cluster.id)
        cluster.provider_state[RECORD] = {"node": target.name, "instance": target.instance_id, "role": made.role,
                                          "profile": made.profile, "policy": made.policy, "keep_old": keep_old}
        save()
        return _create(aws, cluster, made, scope, target, report, save)
    except BaseException as exc:
        what = _undo(aws, cluster, report, save)
        if isinstance(exc, interrupts.Terminated):
            raise interrupts.Terminated(exc.signum, f"making the controller's identity stopped by "
                                                    f"{interrupts.signal_name(exc.signum)}; {what}") from None
        raise


def _undo(aws: Aws, cluster: ClusterRecord, report: Reporter, save: Callable[[], None]) -> str:
    if RECORD not in cluster.provider_state:
        return "nothing was made"
    report("the controller's identity was not completed: removing what was made of it")
    try:
        remove(aws, cluster, silent, save)
    except ToolError as undo:
        report(f"warning: {undo.message} (`clustertool down` removes it)")
        return "`clustertool down` removes what it had made"
    return "what it had made was removed"


def _target(cluster: ClusterRecord, node: str) -> Node:
    if cluster.provider_state.get("adopted"):
        raise NotSupported(f"cluster {cluster.name!r} is made of adopted instances: clustertool replaces none of "
                           "them, so a controller has nothing to do", hint="run `clustertool recover` yourself")
    if not cluster.id:
        raise UsageError(f"cluster {cluster.name!r} has no id (made by an older clustertool): its resources cannot "
                         "be told apart by tag", hint="`down` and `up` it again for a controller")
    picked = nodeset.select(cluster, node)
    if len(picked) != 1:
        raise UsageError(f"the controller runs on one node, not {node!r} ({len(picked)} nodes)",
                         hint="name one node: --controller-node node-2")
    found = picked[0]
    if not found.instance_id:
        raise ProviderError(f"{node} has no instance to hold the controller's identity")
    return found


def _refuse_foreign_profile(aws: Aws, target: Node) -> None:
    """An instance holds one profile: one the user gave it is not ours to take away."""
    for assoc in _associations(aws, target.instance_id or ""):
        arn = (assoc.get("IamInstanceProfile") or {}).get("Arn", "")
        if f":instance-profile{PATH}" not in arn:
            raise UsageError(f"{target.name} ({target.instance_id}) already has an instance profile ({arn}): the "
                             "controller needs its own there", hint="pick another --controller-node")


def _create(aws: Aws, cluster: ClusterRecord, made: Names, scope: Scope, target: Node, report: Reporter,
            save: Callable[[], None]) -> list[str]:
    labels = tags.pairs(_tag_values(cluster))
    report(f"making the controller's role {made.role} (only EC2 may take it)")
    _iam(aws, "create_role", "making the controller's role", Path=PATH, RoleName=made.role,
         AssumeRolePolicyDocument=json.dumps(controller_policy.trust_policy()), Tags=labels,
         Description=f"clustertool recovery controller of {cluster.id}: replaces this cluster's nodes, nothing else")
    _iam(aws, "put_role_policy", "giving the controller's role its policy", RoleName=made.role,
         PolicyName=made.policy, PolicyDocument=json.dumps(controller_policy.policy_document(scope)))
    _iam(aws, "create_instance_profile", "making the controller's instance profile", Path=PATH,
         InstanceProfileName=made.profile, Tags=labels)
    _iam(aws, "add_role_to_instance_profile", "putting the role in the instance profile",
         InstanceProfileName=made.profile, RoleName=made.role)
    report(f"associating the instance profile with {target.name} ({target.instance_id})")
    association = _associate(aws, made.profile, target.instance_id or "")
    cluster.provider_state[RECORD]["association"] = association
    save()
    return [f"made the controller's role {made.role} (policy {made.policy}: replace this cluster's nodes only) "
            f"in instance profile {made.profile}, on {target.name} ({target.instance_id})"]


def _tag_values(cluster: ClusterRecord) -> dict[str, str]:
    owner = cluster.provider_state.get("owner") or {}
    # no lease tag: the lease of a cluster is its `up`'s, told by its EC2 resources (census.py)
    stamp = tags.Stamp(cluster.name, cluster.id, owner=owner.get("arn", ""), home=owner.get("home", ""),
                       created=f"{time.time():.3f}")
    return {**stamp.values(), tags.ROLE: ROLE_TAG}


def _iam(aws: Aws, op: str, what: str, **kwargs: Any) -> dict:
    with aws_errors(what):
        return aws.call(op, "iam", **kwargs)


def _associate(aws: Aws, profile: str, instance_id: str) -> str:
    """AssociateIamInstanceProfile, retried while EC2 does not see the new profile yet; the association's id."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + min(120.0, wait_timeout())
    while True:
        try:
            found = aws.call("associate_iam_instance_profile", IamInstanceProfile={"Name": profile},
                             InstanceId=instance_id)
            return found["IamInstanceProfileAssociation"]["AssociationId"]
        except ClientError as exc:
            if NOT_YET not in error_message(exc) or time.monotonic() > deadline:
                with aws_errors(f"associating the instance profile with {instance_id}"):
                    raise
        interrupts.checkpoint()
        time.sleep(poll_interval())


def _associations(aws: Aws, instance_id: str) -> list[dict]:
    if not instance_id:
        return []
    with aws_errors("listing instance profile associations"):
        found = aws.call("describe_iam_instance_profile_associations",
                         Filters=[{"Name": "instance-id", "Values": [instance_id]}])
    return [a for a in found.get("IamInstanceProfileAssociations", [])
            if a.get("State") in ("associating", "associated")]


def scope_for(aws: Aws, cluster: ClusterRecord, keep_old: bool = False) -> Scope:
    """The policy's inputs, read from the cluster's instances as they are (and its state)."""
    with aws_errors("asking STS for the account"):
        who = aws.call("get_caller_identity", service="sts")
    found = instances.describe(aws, [n.instance_id for n in cluster.nodes if n.instance_id])
    ps, options = cluster.provider_state, cluster.options
    interfaces = [e for i in found for e in i.get("NetworkInterfaces") or []]
    subnets = [i.get("SubnetId") for i in found] + [e.get("SubnetId") for e in interfaces] + [options.get("subnet")]
    groups = [g["GroupId"] for e in interfaces for g in e.get("Groups") or []] + list(ps.get("security_groups") or [])
    keys = [i.get("KeyName") for i in found] + [options.get("key_name")] + list(ps.get("key_pairs") or [])
    placed = [i.get("Placement", {}).get("GroupName") for i in found] + list(ps.get("placement_groups") or [])
    reserved = [i.get("CapacityReservationId") for i in found] + [options.get("capacity_reservation"),
                                                                  options.get("capacity_block")]
    return Scope(cluster.id, aws.region, str(who.get("Account") or ""), _partition(who.get("Arn", "")),
                 subnets=_set(subnets), security_groups=_set(groups), key_pairs=_set(keys),
                 placement_groups=_set(placed), images=_set(i.get("ImageId") for i in found),
                 capacity_reservations=_set(reserved), addresses=_set(ps.get("addresses") or []),
                 spot=bool(options.get("spot")), keep_old=keep_old)


def _set(values: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(sorted({v for v in values if v}))


def _partition(arn: str) -> str:
    parts = arn.split(":")
    return parts[1] if len(parts) > 2 and parts[1] else "aws"


def remove(aws: Aws, cluster: ClusterRecord, report: Reporter = silent,
           save: Callable[[], None] = lambda: None) -> list[str]:
    """Everything :func:`make` made for ``cluster`` (by the names it recorded), in dependency order; lines
    saying what went.  Idempotent; a signal stops it between two deletes with the record kept."""
    record = cluster.provider_state.get(RECORD)
    if not record:
        return []
    made = Names(record["role"], record["profile"], record.get("policy") or controller_policy.POLICY_NAME)
    lines = _remove(aws, made, [record.get("instance") or ""], report)
    cluster.provider_state.pop(RECORD, None)
    save()
    return lines


def _remove(aws: Aws, made: Names, instance_ids: list[str], report: Reporter) -> list[str]:
    gone = []
    for iid in instance_ids:
        for assoc in _associations(aws, iid):
            if (assoc.get("IamInstanceProfile") or {}).get("Arn", "").endswith(f"{PATH}{made.profile}"):
                report(f"taking the controller's instance profile off {iid}")
                _forget(aws, "disassociate_iam_instance_profile", "ec2", AssociationId=assoc["AssociationId"])
        interrupts.checkpoint()
    if made.role in _roles_in(aws, made.profile):  # asked first: a profile killed half way may not hold it
        _forget(aws, "remove_role_from_instance_profile", "iam", InstanceProfileName=made.profile, RoleName=made.role)
        interrupts.checkpoint()
    steps = [("delete_instance_profile", {"InstanceProfileName": made.profile}, f"instance profile {made.profile}"),
             ("delete_role_policy", {"RoleName": made.role, "PolicyName": made.policy}, ""),
             ("delete_role", {"RoleName": made.role}, f"role {made.role} (and its policy)")]
    for op, kwargs, what in steps:
        if _forget(aws, op, "iam", **kwargs) and what:
            gone.append(what)
        interrupts.checkpoint()
    return [f"removed the controller's {' and '.join(gone)}"] if gone else []


def _roles_in(aws: Aws, profile: str) -> list[str]:
    from botocore.exceptions import ClientError

    try:
        found = aws.call("get_instance_profile", "iam", InstanceProfileName=profile)
    except ClientError as exc:
        if error_code(exc) in GONE:
            return []
        with aws_errors("reading the controller's instance profile"):
            raise
    return [r["RoleName"] for r in found["InstanceProfile"].get("Roles") or []]


def _forget(aws: Aws, op: str, service: str, **kwargs: Any) -> bool:
    """One delete; False when it was already gone."""
    from botocore.exceptions import ClientError

    try:
        aws.call(op, service, **kwargs)
        return True
    except ClientError as exc:
        if error_code(exc) in GONE:
            return False
        with aws_errors(f"removing the controller's identity ({op})"):
            raise


def tagged(aws: Aws) -> list[dict]:
    """Every controller role and instance profile under clustertool's path: {kind, name, tags}.  None where
    the identity may not list IAM (a sweep of EC2 must not fail for want of IAM rights)."""
    from botocore.exceptions import ClientError

    try:
        roles = _listed(aws, "list_roles", "Roles")
        profiles = _listed(aws, "list_instance_profiles", "InstanceProfiles")
    except EndpointLacksApi:
        return []
    except ClientError as exc:
        if error_code(exc) in DENIED_CODES:
            return []
        raise
    found = [{"kind": "iam-role", "name": r["RoleName"], "tags": _tags(aws, "list_role_tags", RoleName=r["RoleName"])}
             for r in roles]
    found += [{"kind": "iam-instance-profile", "name": p["InstanceProfileName"],  # IAM's lists carry no tags
               "tags": _tags(aws, "get_instance_profile", InstanceProfileName=p["InstanceProfileName"])}
              for p in profiles]
    return [f for f in found if tags.CLUSTER in tags.as_dict(f["tags"])]


def _listed(aws: Aws, op: str, key: str) -> list[dict]:
    """All items of an IAM list call under clustertool's path (IAM pages with Marker, not NextToken)."""
    items: list[dict] = []
    kwargs: dict = {"PathPrefix": PATH}
    while True:
        page = aws.call(op, "iam", **kwargs)
        items += page.get(key, [])
        if not page.get("IsTruncated") or not page.get("Marker"):
            return items
        kwargs["Marker"] = page["Marker"]


def _tags(aws: Aws, op: str, **kwargs: Any) -> list[dict]:
    from botocore.exceptions import ClientError

    try:
        found = aws.call(op, "iam", **kwargs)
        return (found.get("InstanceProfile") or found).get("Tags", [])
    except ClientError as exc:  # gone meanwhile
        if error_code(exc) in GONE:
            return []
        raise


def remove_found(aws: Aws, roles: list[str], profiles: list[str], report: Reporter = silent) -> list[str]:
    """`down --sweep`: controller roles and profiles a lost state left (found by :func:`tagged`)."""
    lines: list[str] = []
    for name in dict.fromkeys(list(roles) + list(profiles)):
        for assoc in _all_associations(aws, name):
            _forget(aws, "disassociate_iam_instance_profile", "ec2", AssociationId=assoc["AssociationId"])
        lines += _remove(aws, Names(name, name), [], report)
    return lines


def _all_associations(aws: Aws, profile: str) -> list[dict]:
    with aws_errors("listing instance profile associations"):
        found = aws.call("describe_iam_instance_profile_associations")
    return [a for a in found.get("IamInstanceProfileAssociations", [])
            if (a.get("IamInstanceProfile") or {}).get("Arn", "").endswith(f"{PATH}{profile}")
            and a.get("State") in ("associating", "associated")]


def status_lines(cluster: ClusterRecord) -> dict[str, str]:
    """`status`: where the controller's identity is (from the state; no call)."""
    record = cluster.provider_state.get(RECORD)
    if not record:
        return {}
    held = f"on {record.get('node')} ({record.get('instance')})" if record.get("association") else \
        "not associated with any node (`down` removes it)"
    return {"controller identity": f"role {record['role']} in instance profile {record['profile']} {held}: "
                                   "may replace this cluster's nodes and nothing else"}
