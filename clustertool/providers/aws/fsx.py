"""Amazon FSx for Lustre calls of the shared-filesystem feature: create in the cluster's subnet
(tagged, with an S3 prefix imported: ImportPath for scratch deployments, a data repository
association for PERSISTENT_2, which has no ImportPath), find, delete, and the waits.

A Lustre file system takes minutes to create (AWS's own example: about 10 minutes including an
import of COCO 2017) and to delete; both waits report progress and end at the provider's wait timeout.
"""

from __future__ import annotations

from typing import Any, Callable

from clustertool.core import interrupts
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import Reporter
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors, is_code
from clustertool.providers.aws.efs import wait_until

SERVICE = "fsx"
DEPLOYMENTS = ("SCRATCH_2", "PERSISTENT_2", "SCRATCH_1", "PERSISTENT_1")
PORTS = ((988, 988), (1018, 1023))  # Lustre: 988, and 1018-1023
PERSISTENT_2_THROUGHPUT = 125  # MB/s per TiB, the smallest PERSISTENT_2 takes
GONE = ("FileSystemNotFound",)


def check_capacity(deployment: str, gib: int) -> None:
    """The sizes the API takes: 1200, 2400, then steps of 2400 GiB (SCRATCH_1 also 3600)."""
    ok = gib in (1200, 2400) or (gib > 2400 and gib % 2400 == 0) or (deployment == "SCRATCH_1" and gib == 3600)
    if not ok:
        raise UsageError(f"--fsx-capacity {gib}: FSx for Lustre {deployment} takes 1200, 2400, or a multiple of "
                         "2400 GiB", hint="e.g. --fsx-capacity 1200")


def check_import(path: str | None) -> None:
    if path and (not path.startswith("s3://") or len(path) <= len("s3://") or path.startswith("s3:///")):
        raise UsageError(f"--fsx-import {path!r}: expected s3://BUCKET[/PREFIX]", hint="e.g. s3://my-bucket/coco2017")


def create_params(token: str, stamp: tags.Stamp, name: str, *, subnet: str, group: str, capacity: int,
                  deployment: str, import_path: str | None) -> dict[str, Any]:
    """CreateFileSystem's arguments for a Lustre file system (ImportPath where the deployment takes one)."""
    lustre: dict[str, Any] = {"DeploymentType": deployment}
    if deployment.startswith("PERSISTENT"):
        lustre["PerUnitStorageThroughput"] = PERSISTENT_2_THROUGHPUT if deployment == "PERSISTENT_2" else 50
    if import_path and deployment != "PERSISTENT_2":
        lustre["ImportPath"] = import_path  # metadata imported at creation, contents loaded on first read
        lustre["AutoImportPolicy"] = "NEW_CHANGED_DELETED"
    return {"ClientRequestToken": token[:63], "FileSystemType": "LUSTRE", "StorageCapacity": int(capacity),
            "StorageType": "SSD", "SubnetIds": [subnet], "SecurityGroupIds": [group],
            "LustreConfiguration": lustre,
            "Tags": tags.pairs({**stamp.values(), tags.ROLE: "shared-fs", tags.NAME: name})}


def association_params(fs_id: str, import_path: str) -> dict[str, Any]:
    """A PERSISTENT_2 file system's import: a data repository association of its root with the S3 prefix
    (metadata imported now, contents loaded lazily on first read, S3 changes followed)."""
    return {"FileSystemId": fs_id, "FileSystemPath": "/", "DataRepositoryPath": import_path,
            "BatchImportMetaDataOnCreate": True,
            "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}}


def create(aws: Aws, params: dict[str, Any]) -> dict:
    with aws_errors("creating the FSx for Lustre file system"):
        return aws.call("create_file_system", SERVICE, **params)["FileSystem"]


def describe(aws: Aws, fs_id: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_file_systems", SERVICE, FileSystemIds=[fs_id]).get("FileSystems", [])
    except ClientError as exc:
        if is_code(exc, *GONE):
            return None
        with aws_errors(f"describing FSx file system {fs_id}"):
            raise
    return found[0] if found else None


def existing(aws: Aws, fs_id: str) -> dict:
    found = describe(aws, fs_id)
    if found is None:
        raise UsageError(f"--shared-fs fsx:{fs_id}: no such FSx file system in {aws.region}",
                         hint="list them with `aws fsx describe-file-systems`")
    if found.get("FileSystemType") != "LUSTRE":
        raise UsageError(f"--shared-fs fsx:{fs_id}: it is an FSx for {found.get('FileSystemType')} file system, "
                         "not Lustre")
    return found


def tagged(aws: Aws, match: Callable[[dict[str, str]], bool]) -> list[dict]:
    with aws_errors("listing FSx file systems"):
        found = aws.paginate("describe_file_systems", "FileSystems", SERVICE)
    return [fs for fs in found if match(tags.as_dict(fs.get("Tags")))]


def wait_available(aws: Aws, fs_id: str, report: Reporter) -> dict:
    """Until Lifecycle is AVAILABLE; FAILED / MISCONFIGURED are errors with AWS's own reason."""
    seen: dict[str, dict] = {}

    def ready() -> bool:
        found = describe(aws, fs_id)
        if found is None:
            raise ProviderError(f"FSx file system {fs_id} disappeared while it was being created")
        state = found.get("Lifecycle")
        if state in ("FAILED", "MISCONFIGURED", "MISCONFIGURED_UNAVAILABLE", "DELETING"):
            why = (found.get("FailureDetails") or {}).get("Message") or "no reason given"
            raise ProviderError(f"FSx file system {fs_id} is {state}: {why}",
                                hint="check --fsx-import's bucket and the subnet; `clustertool down` removes it")
        seen["fs"] = found
        return state == "AVAILABLE"
    wait_until(f"FSx for Lustre file system {fs_id} to become available (usually 5-15 minutes)", ready, report,
               factor=2.0)  # an import of a large prefix takes longer than instances do
    return seen["fs"]


def associate(aws: Aws, fs_id: str, import_path: str) -> str:
    with aws_errors(f"linking {import_path} to {fs_id} (data repository association)"):
        answer = aws.call("create_data_repository_association", SERVICE, **association_params(fs_id, import_path))
    return answer.get("Association", {}).get("AssociationId", "")


def mount_name(found: dict) -> str:
    name = (found.get("LustreConfiguration") or {}).get("MountName")
    if not name:
        raise ProviderError(f"FSx file system {found.get('FileSystemId')} has no MountName in the API's answer",
                            hint="the endpoint does not report Lustre mount names (AWS always does)")
    return str(name)


def delete(aws: Aws, fs_id: str, report: Reporter) -> bool:
    """Delete (no final backup: a scratch file system has none, and the cluster's data is the user's S3)
    and wait until it is gone."""
    from botocore.exceptions import ClientError

    interrupts.checkpoint()
    found = describe(aws, fs_id)
    if found is None:
        return False
    if found.get("Lifecycle") != "DELETING":
        kwargs: dict[str, Any] = {"FileSystemId": fs_id}
        if (found.get("LustreConfiguration") or {}).get("DeploymentType", "").startswith("PERSISTENT"):
            kwargs["LustreConfiguration"] = {"SkipFinalBackup": True}
        try:
            aws.call("delete_file_system", SERVICE, **kwargs)
        except ClientError as exc:
            if is_code(exc, *GONE):
                return False
            with aws_errors(f"deleting FSx file system {fs_id}"):
                raise
    wait_until(f"FSx file system {fs_id} to be deleted", lambda: describe(aws, fs_id) is None, report, factor=2.0)
    return True


def retag(aws: Aws, arn: str, keys: list[str], add: dict[str, str]) -> None:
    with aws_errors(f"retagging {arn}"):
        aws.call("untag_resource", SERVICE, ResourceARN=arn, TagKeys=keys)
        if add:
            aws.call("tag_resource", SERVICE, ResourceARN=arn, Tags=tags.pairs(add))
