"""Amazon EFS calls of the shared-filesystem feature: create (tagged, encrypted), find, mount
targets in the cluster's subnet, delete, and the waits between.

EFS has no tag filter on DescribeFileSystems: a cluster's file systems are found by listing the
region's and reading their tags. A new one's CreationToken is derived from the cluster id, so a
retried or repeated create finds the one already made instead of making a second.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from clustertool.core import interrupts
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import Reporter
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors, is_code, poll_interval, wait_timeout

SERVICE = "efs"
NFS_PORT = 2049
THROUGHPUT = ("elastic", "bursting", "provisioned")


def dns_name(fs_id: str, region: str) -> str:
    """The file system's DNS name, in the form AWS documents (resolves inside the VPC)."""
    return f"{fs_id}.efs.{region}.amazonaws.com"


def create_params(token: str, stamp: tags.Stamp, name: str, throughput: str = "elastic",
                  provisioned_mibps: float | None = None) -> dict[str, Any]:
    """CreateFileSystem's arguments: encrypted, general purpose, the cluster's tags."""
    params: dict[str, Any] = {"CreationToken": token, "PerformanceMode": "generalPurpose", "Encrypted": True,
                              "ThroughputMode": throughput,
                              "Tags": tags.pairs({**stamp.values(), tags.ROLE: "shared-fs", tags.NAME: name})}
    if throughput == "provisioned":
        params["ProvisionedThroughputInMibps"] = float(provisioned_mibps or 0)
    return params


def create(aws: Aws, params: dict[str, Any]) -> dict:
    """A new file system (or the one this CreationToken already made)."""
    from botocore.exceptions import ClientError

    try:
        return aws.call("create_file_system", SERVICE, **params)
    except ClientError as exc:
        if not is_code(exc, "FileSystemAlreadyExists"):
            with aws_errors("creating the EFS file system"):
                raise
    found = by_token(aws, params["CreationToken"])
    if not found:
        raise ProviderError("EFS said the file system exists but does not list it", hint="run the command again")
    return found


def by_token(aws: Aws, token: str) -> dict | None:
    with aws_errors("describing EFS file systems"):
        found = aws.call("describe_file_systems", SERVICE, CreationToken=token).get("FileSystems", [])
    return found[0] if found else None


def describe(aws: Aws, fs_id: str) -> dict | None:
    """The file system, or None when there is no such one."""
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_file_systems", SERVICE, FileSystemId=fs_id).get("FileSystems", [])
    except ClientError as exc:
        if is_code(exc, "FileSystemNotFound"):
            return None
        with aws_errors(f"describing EFS file system {fs_id}"):
            raise
    return found[0] if found else None


def existing(aws: Aws, fs_id: str) -> dict:
    """An existing file system to attach; one line when there is none."""
    found = describe(aws, fs_id)
    if found is None:
        raise UsageError(f"--shared-fs efs:{fs_id}: no such EFS file system in {aws.region}",
                         hint="list them with `aws efs describe-file-systems`")
    return found


def tagged(aws: Aws, match: Callable[[dict[str, str]], bool]) -> list[dict]:
    """Every file system of the region whose tags ``match`` (EFS has no server-side tag filter)."""
    out: list[dict] = []
    marker: str | None = None
    while True:
        kwargs = {"Marker": marker} if marker else {}
        with aws_errors("listing EFS file systems"):
            page = aws.call("describe_file_systems", SERVICE, **kwargs)
        out += [fs for fs in page.get("FileSystems", []) if match(tags.as_dict(fs.get("Tags")))]
        marker = page.get("NextMarker")
        if not marker:
            return out


def mount_targets(aws: Aws, fs_id: str) -> list[dict]:
    from botocore.exceptions import ClientError

    try:
        return aws.call("describe_mount_targets", SERVICE, FileSystemId=fs_id).get("MountTargets", [])
    except ClientError as exc:
        if is_code(exc, "FileSystemNotFound"):
            return []
        with aws_errors(f"listing the mount targets of {fs_id}"):
            raise


def target_groups(aws: Aws, target_id: str) -> list[str]:
    from botocore.exceptions import ClientError

    try:
        return aws.call("describe_mount_target_security_groups", SERVICE,
                        MountTargetId=target_id).get("SecurityGroups", [])
    except ClientError as exc:
        if is_code(exc, "MountTargetNotFound"):
            return []
        with aws_errors(f"describing the security groups of mount target {target_id}"):
            raise


def target_in(aws: Aws, fs_id: str, subnet: str, az: str) -> dict | None:
    """The file system's mount target serving ``subnet``'s zone (one per zone), if any."""
    for target in mount_targets(aws, fs_id):
        if target.get("SubnetId") == subnet or target.get("AvailabilityZoneName") == az:
            return target
    return None


def create_target(aws: Aws, fs_id: str, subnet: str, group: str) -> dict:
    with aws_errors(f"creating a mount target for {fs_id}"):
        return aws.call("create_mount_target", SERVICE, FileSystemId=fs_id, SubnetId=subnet, SecurityGroups=[group])


def wait_until(what: str, probe: Callable[[], bool], report: Reporter, every: float = 30.0,
               factor: float = 1.0) -> None:
    """Poll ``probe`` until true, a progress line every ``every`` s, at most ``factor`` times the provider's
    wait timeout (CLUSTERTOOL_AWS_TIMEOUT, default 20 minutes)."""
    start = time.monotonic()
    said = start
    while not probe():
        now = time.monotonic()
        if now - start > wait_timeout() * factor:
            raise ProviderError(f"{what}: not done after {now - start:.0f}s",
                                hint="run `clustertool down` to remove what was made, then try again")
        if now - said >= every:
            report(f"waiting for {what} ({now - start:.0f}s)")
            said = now
        interrupts.checkpoint()
        time.sleep(poll_interval())


def wait_available(aws: Aws, fs_id: str, report: Reporter) -> dict:
    seen: dict[str, dict] = {}

    def ready() -> bool:
        found = describe(aws, fs_id)
        if found is None:
            raise ProviderError(f"EFS file system {fs_id} disappeared while it was being created")
        state = found.get("LifeCycleState")
        if state == "error":
            raise ProviderError(f"EFS file system {fs_id} failed to create (state: error)")
        seen["fs"] = found
        return state == "available"
    wait_until(f"EFS file system {fs_id} to become available", ready, report)
    return seen["fs"]


def wait_target(aws: Aws, fs_id: str, target_id: str, report: Reporter) -> dict:
    seen: dict[str, dict] = {}

    def ready() -> bool:
        found = [t for t in mount_targets(aws, fs_id) if t.get("MountTargetId") == target_id]
        if not found:
            raise ProviderError(f"mount target {target_id} of {fs_id} disappeared while it was being created")
        seen["t"] = found[0]
        return found[0].get("LifeCycleState") == "available"
    wait_until(f"the mount target of {fs_id}", ready, report)
    return seen["t"]


def delete_target(aws: Aws, target_id: str) -> bool:
    from botocore.exceptions import ClientError

    interrupts.checkpoint()
    try:
        aws.call("delete_mount_target", SERVICE, MountTargetId=target_id)
        return True
    except ClientError as exc:
        if is_code(exc, "MountTargetNotFound"):
            return False
        with aws_errors(f"deleting mount target {target_id}"):
            raise


def wait_targets_gone(aws: Aws, fs_id: str, ids: list[str], report: Reporter) -> None:
    wait_until(f"the mount targets of {fs_id} to go",
          lambda: not {t.get("MountTargetId") for t in mount_targets(aws, fs_id)} & set(ids), report)


def delete(aws: Aws, fs_id: str, report: Reporter) -> bool:
    """Delete the file system and wait until it is gone (its mount targets must be gone first)."""
    from botocore.exceptions import ClientError

    interrupts.checkpoint()
    deadline = time.monotonic() + wait_timeout()
    while True:
        try:
            aws.call("delete_file_system", SERVICE, FileSystemId=fs_id)
            break
        except ClientError as exc:
            if is_code(exc, "FileSystemNotFound"):
                return False
            if not is_code(exc, "FileSystemInUse") or time.monotonic() > deadline:
                with aws_errors(f"deleting EFS file system {fs_id}"):
                    raise
            time.sleep(poll_interval())  # mount targets still going
            interrupts.checkpoint()
    wait_until(f"EFS file system {fs_id} to be deleted", lambda: describe(aws, fs_id) is None, report)
    return True


def untag(aws: Aws, fs_id: str, keys: list[str], add: dict[str, str]) -> None:
    with aws_errors(f"retagging EFS file system {fs_id}"):
        aws.call("untag_resource", SERVICE, ResourceId=fs_id, TagKeys=keys)
        if add:
            aws.call("tag_resource", SERVICE, ResourceId=fs_id, Tags=tags.pairs(add))
