"""Removing a cluster's shared filesystems (`down`, a failed `up`'s rollback, `down --sweep`), or keeping them.

Order: the instances (their bill stops first), mount targets (and wait until gone), then the file
systems (and wait until gone), then their security groups, all before the cluster's own group goes
(a file system's group names the cluster's group in its rules, and AWS refuses to delete a group
another group's rule names).  What was made is found by the state and by the cluster's id tag (an
`up` killed right after CreateFileSystem recorded nothing); attached file systems only lose the
mount targets this cluster added to them.

``--keep-shared-fs``: the file systems stay, with their data; their clustertool cluster/id tags give
way to ``clustertool:kept-from=<cluster id>``, so no sweep takes them for leftovers, and `down` says
what stays and about what it costs per month.
"""

from __future__ import annotations

import time
from typing import Callable

from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, Reporter
from clustertool.providers.aws import efs, fsx, tags, teardown
from clustertool.providers.aws.client import Aws, EndpointLacksApi, aws_errors, wait_timeout
from clustertool.providers.aws.filesystems import KEPT, ROLE, price_line
from clustertool.providers.aws.teardown import Owned, delete_resource, tagged_security_groups, terminate_and_wait


def _merge(*lists) -> list[str]:
    out: list[str] = []
    for items in lists:
        out += [i for i in items or [] if i and i not in out]
    return out


def tagged_file_systems(aws: Aws, kind: str, match: Callable[[dict[str, str]], bool]) -> list[dict]:
    """Tagged EFS / FSx file systems; none where the identity may not list them or the endpoint lacks the API
    (a sweep or a `down` of a cluster without shared filesystems must not fail for want of EFS rights)."""
    try:
        return (efs if kind == "efs" else fsx).tagged(aws, match)
    except EndpointLacksApi:
        return []
    except ToolError as exc:
        if "AccessDenied" in exc.message or "UnauthorizedOperation" in exc.message:
            return []
        raise


def _cluster_match(cluster: ClusterRecord) -> Callable[[dict[str, str]], bool]:
    stamp = tags.Stamp(cluster.name, cluster.id)
    return lambda values: (values.get(tags.CLUSTER) == cluster.name
                           and stamp.owns([{"Key": k, "Value": v} for k, v in values.items()]))


def _fs_groups(aws: Aws, cluster: ClusterRecord) -> list[str]:
    flt = tags.Stamp(cluster.name, cluster.id).filter() + [{"Name": f"tag:{tags.ROLE}", "Values": [ROLE]}]
    return [g["GroupId"] for g in tagged_security_groups(aws, flt)]


def before_groups(aws: Aws, cluster: ClusterRecord, owned: Owned, report: Reporter) -> tuple[list[str], Owned]:
    """`down`'s shared-filesystem step: the instances go first (their bill stops; an FSx takes minutes to
    delete), then the file systems and their groups (or, --keep-shared-fs, they stay); returns the lines
    and what is left for ``teardown.remove``."""
    if not cluster.provider_state.get("shared_fs") and not cluster.options.get("shared_fs"):
        return [], owned
    lines = []
    if owned.instances:
        terminate_and_wait(aws, owned.instances, report)
        lines.append(f"terminated {len(owned.instances)} instance(s): {', '.join(owned.instances)}")
    lines += remove(aws, cluster, cluster.keep_shared_fs, report)
    return lines, teardown.owned(aws, cluster)


def remove(aws: Aws, cluster: ClusterRecord, keep: bool, report: Reporter) -> list[str]:
    """Remove (or, with ``keep``, keep) the cluster's shared filesystems; lines saying what happened."""
    entries = cluster.provider_state.get("shared_fs", [])
    wants = cluster.options.get("shared_fs") or []
    if not entries and not wants:
        return []
    match = _cluster_match(cluster)
    made_efs = _merge([e["id"] for e in entries if e.get("made") and e["kind"] == "efs"],
                      [f["FileSystemId"] for f in tagged_file_systems(aws, "efs", match)])
    made_fsx = _merge([e["id"] for e in entries if e.get("made") and e["kind"] == "fsx"],
                      [f["FileSystemId"] for f in tagged_file_systems(aws, "fsx", match)])
    groups = _merge([e.get("group") for e in entries], _fs_groups(aws, cluster))
    attached = _merge([e["id"] for e in entries if not e.get("made") and e["kind"] == "efs"],
                      [w.get("id") for w in wants if w.get("kind") == "efs"])
    lines = [line for fs_id in attached for line in _our_targets(aws, fs_id, groups, report)]
    if keep:
        lines += _keep(aws, cluster, made_efs, made_fsx, groups, report)
    else:
        lines += remove_found(aws, made_efs, made_fsx, groups, report)
    return lines


def _our_targets(aws: Aws, fs_id: str, groups: list[str], report: Reporter) -> list[str]:
    """The mount targets this cluster added to an attached EFS (they are in one of its groups)."""
    ours = [t["MountTargetId"] for t in efs.mount_targets(aws, fs_id)
            if set(efs.target_groups(aws, t["MountTargetId"])) & set(groups)]
    gone = [t for t in ours if efs.delete_target(aws, t)]
    if ours:
        efs.wait_targets_gone(aws, fs_id, ours, report)
    return [f"deleted mount target {t} of attached EFS {fs_id} (the file system stays)" for t in gone]


def remove_found(aws: Aws, efs_ids: list[str], fsx_ids: list[str], group_ids: list[str],
                 report: Reporter) -> list[str]:
    """Delete these file systems (mount targets first, each waited out) and those of ``group_ids`` that
    are shared-filesystem groups (others are left to the caller)."""
    lines = []
    for fs_id in efs_ids:
        targets = _drop_targets(aws, fs_id, report)
        if efs.delete(aws, fs_id, report):
            lines.append(f"deleted EFS {fs_id}" + (f" and its {len(targets)} mount target(s)" if targets else ""))
    for fs_id in fsx_ids:
        report(f"deleting FSx file system {fs_id} and waiting until it is gone (minutes)")
        if fsx.delete(aws, fs_id, report):
            lines.append(f"deleted FSx for Lustre {fs_id}")
    deadline = _deadline()
    for gid in _only_fs_groups(aws, group_ids):
        if delete_resource(aws, "security_group", gid, deadline, GroupId=gid):
            lines.append(f"deleted security group {gid} (shared fs)")
    return lines


def _drop_targets(aws: Aws, fs_id: str, report: Reporter) -> list[str]:
    """Delete every mount target of EFS ``fs_id`` and wait until they are gone; their ids."""
    targets = [t["MountTargetId"] for t in efs.mount_targets(aws, fs_id)]
    for target in targets:
        efs.delete_target(aws, target)
    if targets:
        efs.wait_targets_gone(aws, fs_id, targets, report)
    return targets


def _deadline() -> float:
    return time.monotonic() + wait_timeout()


def _only_fs_groups(aws: Aws, group_ids: list[str]) -> list[str]:
    if not group_ids:
        return []
    found = tagged_security_groups(aws, [{"Name": "group-id", "Values": group_ids},
                                         {"Name": f"tag:{tags.ROLE}", "Values": [ROLE]}])
    return [g["GroupId"] for g in found]


def _keep(aws: Aws, cluster: ClusterRecord, efs_ids: list[str], fsx_ids: list[str], groups: list[str],
          report: Reporter) -> list[str]:
    """The file systems stay: EFS loses the mount targets and group made for this cluster; an FSx keeps its
    group (it cannot change groups) minus the rules naming the cluster's group; both are untagged."""
    entries = {e["id"]: e for e in cluster.provider_state.get("shared_fs", [])}
    retag = {KEPT: cluster.id or cluster.name}
    drop = [tags.CLUSTER, tags.ID, tags.LEASE]
    lines = []
    kept_groups = []
    for fs_id in efs_ids:
        _drop_targets(aws, fs_id, report)
        efs.untag(aws, fs_id, drop, retag)
        lines.append(_kept_line("efs", fs_id, entries.get(fs_id)))
    for fs_id in fsx_ids:
        found = fsx.describe(aws, fs_id)
        if found is None:
            continue
        for gid in found.get("SecurityGroupIds") or []:
            if gid in groups:
                _unlink_group(aws, gid, drop, retag)
                kept_groups.append(gid)
        fsx.retag(aws, found["ResourceARN"], drop, retag)
        lines.append(_kept_line("fsx", fs_id, entries.get(fs_id) or {"kind": "fsx",
                                                                       "size_gib": found.get("StorageCapacity")}))
    recorded = cluster.provider_state.get("security_groups", [])
    for gid in kept_groups:
        if gid in recorded:
            recorded.remove(gid)
    lines += remove_found(aws, [], [], [g for g in groups if g not in kept_groups], report)
    return lines


def _unlink_group(aws: Aws, gid: str, drop: list[str], add: dict[str, str]) -> None:
    """A kept FSx's group: rules naming other groups (the cluster's, about to go) revoked, cluster tags off."""
    with aws_errors(f"describing security group {gid}"):
        found = aws.call("describe_security_groups", GroupIds=[gid]).get("SecurityGroups", [])
    for perm in (found[0].get("IpPermissions", []) if found else []):
        others = [p for p in perm.get("UserIdGroupPairs", []) if p.get("GroupId") != gid]
        if others:
            with aws_errors(f"revoking the cluster's rules of {gid}"):
                aws.call("revoke_security_group_ingress", GroupId=gid, IpPermissions=[
                    {"IpProtocol": perm["IpProtocol"], "FromPort": perm.get("FromPort"), "ToPort": perm.get("ToPort"),
                     "UserIdGroupPairs": [{"GroupId": p["GroupId"]} for p in others]}])
    with aws_errors(f"retagging security group {gid}"):
        aws.call("delete_tags", Resources=[gid], Tags=[{"Key": k} for k in drop])
        aws.call("create_tags", Resources=[gid], Tags=tags.pairs(add))


def _kept_line(kind: str, fs_id: str, entry: dict | None) -> str:
    entry = entry or {"kind": kind}
    where = f" ({entry['mount']})" if entry.get("mount") else ""
    delete = (f"aws efs delete-file-system --file-system-id {fs_id}" if kind == "efs"
              else f"aws fsx delete-file-system --file-system-id {fs_id}")
    return (f"kept {'EFS' if kind == 'efs' else 'FSx for Lustre'} {fs_id}{where}: {price_line(entry)} while it "
            f"exists; attach it with --shared-fs {kind}:{fs_id}; delete it with `{delete}`")
