"""Shared filesystems on AWS against the moto server: EFS and FSx for Lustre made or attached at `up`,
removed (or kept) at `down`, swept when their cluster's state is lost.

moto (5.2) implements the EFS and FSx calls used here, but its FSx answers lack two fields the real
API always sends: ``Lifecycle`` and ``LustreConfiguration.MountName``, and it has no
CreateDataRepositoryAssociation (PERSISTENT_2's import).  ``FsxLifecycle`` (a stand-in at the
provider's client seam) adds the fields (CREATING on the first describe, AVAILABLE after, a mount
name) and answers that one call as the API documents it; every other call goes to moto.  Nodes are not
mounted here (moto's instances run no sshd: `--no-ssh`); mounting on real nodes is the local tier's.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--no-ssh", "--access", "all")


class FsxLifecycle:
    """Stand-in for the FSx fields moto omits (see the module doc)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.created: list[dict] = []
        self.associations: list[dict] = []

    def __call__(self, service, op, kwargs, call):
        if service == "fsx" and op == "create_data_repository_association":  # moto lacks this call
            self.associations.append(kwargs)
            return {"Association": {"AssociationId": "dra-0123456789abcdef0", "Lifecycle": "CREATING"}}
        answer = call()
        if service == "fsx" and op == "create_file_system":
            self.created.append(kwargs)
        if service == "fsx" and op == "describe_file_systems":
            for fs in answer.get("FileSystems", []):
                n = self.seen[fs["FileSystemId"]] = self.seen.get(fs["FileSystemId"], 0) + 1
                fs.setdefault("Lifecycle", "CREATING" if n == 1 else "AVAILABLE")
                fs.setdefault("LustreConfiguration", {}).setdefault("MountName", "abcdef12")
        return answer


@pytest.fixture
def fsxw(aws, monkeypatch):
    from clustertool.providers.aws import client

    stand_in = FsxLifecycle()
    monkeypatch.setattr(client, "HOOKS", [*client.HOOKS, stand_in])
    return stand_in


def _efs(aws):
    import boto3

    return boto3.client("efs", endpoint_url=aws.url, region_name="us-east-1")


def _fsx(aws):
    import boto3

    return boto3.client("fsx", endpoint_url=aws.url, region_name="us-east-1")


def _tags(items) -> dict:
    return {t["Key"]: t["Value"] for t in items or []}


def _cluster_id(name: str) -> str:
    from clustertool.core import state

    return state.load(name).id


def _state(name: str) -> dict:
    from clustertool.core import state

    return state.load(name).provider_state


def _group(aws, gid: str) -> dict:
    return aws.ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0]


def _cluster_group(aws, name: str) -> str:
    [group] = [g for g in aws.ec2.describe_security_groups(
        Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])["SecurityGroups"]
        if _tags(g.get("Tags")).get("clustertool:role") != "shared-fs"]
    return group["GroupId"]


def _only_from(group: dict, source: str) -> list[tuple[int, int]]:
    """The group's inbound port ranges, asserting each admits ``source`` (and the group itself) only."""
    ranges = []
    for perm in group["IpPermissions"]:
        assert perm["IpProtocol"] == "tcp" and not perm.get("IpRanges") and not perm.get("Ipv6Ranges"), perm
        assert {p["GroupId"] for p in perm["UserIdGroupPairs"]} <= {source, group["GroupId"]}, perm
        assert source in {p["GroupId"] for p in perm["UserIdGroupPairs"]}
        ranges.append((perm["FromPort"], perm["ToPort"]))
    return sorted(ranges)


def _subnet_of_instances(aws, name: str) -> str:
    return {i["SubnetId"] for i in aws.instances(name)}.pop()


def test_up_with_efs_makes_a_tagged_encrypted_fs_a_mount_target_nfs_from_the_cluster_only_and_down_leaves_none(aws):
    name = unique("efs")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "efs")
    assert code == 0, err
    [fs] = _efs(aws).describe_file_systems()["FileSystems"]
    cluster_id = _cluster_id(name)
    assert _tags(fs["Tags"])["clustertool:id"] == cluster_id and _tags(fs["Tags"])["clustertool:cluster"] == name
    assert fs["Encrypted"] and fs["PerformanceMode"] == "generalPurpose" and fs["ThroughputMode"] == "elastic"
    [target] = _efs(aws).describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]
    assert target["SubnetId"] == _subnet_of_instances(aws, name)
    [gid] = _efs(aws).describe_mount_target_security_groups(MountTargetId=target["MountTargetId"])["SecurityGroups"]
    assert _only_from(_group(aws, gid), _cluster_group(aws, name)) == [(2049, 2049)]
    [entry] = _state(name)["shared_fs"]
    assert entry["made"] and entry["mount"] == "/shared" and entry["id"] == fs["FileSystemId"]
    assert entry["source"] == f"{fs['FileSystemId']}.efs.us-east-1.amazonaws.com:/"
    assert f"EFS {fs['FileSystemId']} created" in err and "$0.30/GB-month" in err
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0 and "$0.30/GB-month" in out, out

    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"deleted EFS {fs['FileSystemId']} and its 1 mount target(s)" in err
    ops = aws.recorder.ops
    assert ops.index("terminate_instances") < ops.index("delete_mount_target") < ops.index("delete_file_system")
    assert _efs(aws).describe_file_systems()["FileSystems"] == []
    assert aws.ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [gid]}])["SecurityGroups"] == []
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def _existing_efs(aws, token: str = "users-own") -> str:
    return _efs(aws).create_file_system(CreationToken=token, Tags=[{"Key": "Name", "Value": "datasets"}])[
        "FileSystemId"]


def test_attaching_an_efs_with_a_mount_target_in_the_zone_creates_nothing_and_down_deletes_nothing(aws):
    fs_id = _existing_efs(aws)
    subnet = aws.ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]},
                                               {"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]
    theirs = _efs(aws).create_mount_target(FileSystemId=fs_id, SubnetId=subnet["SubnetId"])["MountTargetId"]
    name = unique("att")
    code, out, err = aws.ct(*UP, "--az", "us-east-1a", "--name", name, "--shared-fs", f"efs:{fs_id}@/data")
    assert code == 0, err
    made = [op for op in aws.recorder.ops if op in ("create_file_system", "create_mount_target")]
    assert made == [] and len(_efs(aws).describe_file_systems()["FileSystems"]) == 1
    assert f"has a mount target in us-east-1a ({theirs}" in err
    [entry] = _state(name)["shared_fs"]
    assert not entry["made"] and entry["mount"] == "/data" and entry["mount_target"] is None
    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    [fs] = _efs(aws).describe_file_systems()["FileSystems"]
    assert fs["FileSystemId"] == fs_id and _tags(fs["Tags"]) == {"Name": "datasets"}
    assert [t["MountTargetId"] for t in _efs(aws).describe_mount_targets(FileSystemId=fs_id)["MountTargets"]] == [
        theirs]
    assert aws.total_leaks(name) == 0


def test_attaching_an_efs_without_a_mount_target_adds_one_and_down_removes_only_that(aws):
    fs_id = _existing_efs(aws)
    name = unique("att")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", f"efs:{fs_id}")
    assert code == 0, err
    assert "create_file_system" not in aws.recorder.ops
    [target] = _efs(aws).describe_mount_targets(FileSystemId=fs_id)["MountTargets"]
    assert target["SubnetId"] == _subnet_of_instances(aws, name)
    assert _state(name)["shared_fs"][0]["mount_target"] == target["MountTargetId"]
    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"deleted mount target {target['MountTargetId']} of attached EFS {fs_id}" in err
    assert [f["FileSystemId"] for f in _efs(aws).describe_file_systems()["FileSystems"]] == [fs_id]
    assert _efs(aws).describe_mount_targets(FileSystemId=fs_id)["MountTargets"] == []
    assert aws.total_leaks(name) == 0


def test_attaching_an_efs_that_does_not_exist_is_one_line_and_makes_nothing(aws):
    from clustertool.core import state

    name = unique("nofs")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "efs:fs-0123456789abcdef0")
    assert code != 0
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --shared-fs efs:fs-0123456789abcdef0: no such EFS file system in us-east-1"]
    assert "Traceback" not in err and "run_instances" not in aws.recorder.ops
    assert not state.exists(name) and aws.total_leaks(name) == 0


def test_down_keep_shared_fs_keeps_the_efs_untagged_from_the_cluster_and_says_what_it_costs(aws):
    name = unique("keep")
    assert aws.ct(*UP, "--name", name, "--shared-fs", "efs")[0] == 0
    cluster_id = _cluster_id(name)
    code, out, err = aws.ct("down", "-c", name, "--yes", "--keep-shared-fs")
    assert code == 0, err
    [fs] = _efs(aws).describe_file_systems()["FileSystems"]
    fs_id = fs["FileSystemId"]
    assert f"kept EFS {fs_id} (/shared): about $0.00/month" in err and "$0.30/GB-month" in err
    assert f"--shared-fs efs:{fs_id}" in err
    assert _tags(fs["Tags"])["clustertool:kept-from"] == cluster_id
    assert "clustertool:cluster" not in _tags(fs["Tags"]) and "clustertool:id" not in _tags(fs["Tags"])
    assert _efs(aws).describe_mount_targets(FileSystemId=fs_id)["MountTargets"] == []
    assert aws.total_leaks(name) == 0, aws.leaks(name)  # groups included: the kept EFS needs none
    code, out, err = aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 0 and json.loads(out)["orphans"] == []  # a kept file system is no leftover
    assert len(_efs(aws).describe_file_systems()["FileSystems"]) == 1


def test_up_with_fsx_import_sends_the_s3_path_in_the_subnet_with_lustre_ports_from_the_cluster_only(aws, fsxw):
    name = unique("fsx")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "fsx@/data", "--fsx-import", "s3://my-bucket/coco",
                            "--fsx-capacity", "2400")
    assert code == 0, err
    [sent] = fsxw.created
    assert sent["LustreConfiguration"]["ImportPath"] == "s3://my-bucket/coco"
    assert sent["LustreConfiguration"]["DeploymentType"] == "SCRATCH_2" and sent["StorageCapacity"] == 2400
    assert sent["SubnetIds"] == [_subnet_of_instances(aws, name)]
    [fs] = _fsx(aws).describe_file_systems()["FileSystems"]
    assert _tags(fs["Tags"])["clustertool:cluster"] == name
    [gid] = sent["SecurityGroupIds"]
    assert _only_from(_group(aws, gid), _cluster_group(aws, name)) == [(988, 988), (1018, 1023)]
    [entry] = _state(name)["shared_fs"]
    assert entry["source"] == f"{fs['DNSName']}@tcp:/abcdef12" and entry["mount"] == "/data"
    assert "$336.00/month" in err  # 2400 GiB SCRATCH_2 at $0.140
    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"deleted FSx for Lustre {fs['FileSystemId']}" in err
    assert _fsx(aws).describe_file_systems()["FileSystems"] == [] and aws.total_leaks(name) == 0


def test_provisioned_efs_throughput_is_sent_and_priced(aws):
    name = unique("prov")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "efs", "--efs-throughput", "provisioned:128")
    assert code == 0, err
    [fs] = _efs(aws).describe_file_systems()["FileSystems"]
    assert fs["ThroughputMode"] == "provisioned" and fs["ProvisionedThroughputInMibps"] == 128
    assert "about $768.00/month" in err and "128 MiB/s provisioned at $6.00/MiB/s-month" in err
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_persistent_2_imports_through_a_data_repository_association_not_an_import_path(aws, fsxw):
    name = unique("p2")
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "fsx", "--fsx-deployment", "PERSISTENT_2",
                            "--fsx-import", "s3://my-bucket/coco")
    assert code == 0, err
    [sent] = fsxw.created
    assert "ImportPath" not in sent["LustreConfiguration"]
    assert sent["LustreConfiguration"]["PerUnitStorageThroughput"] == 125
    [assoc] = fsxw.associations
    assert assoc["DataRepositoryPath"] == "s3://my-bucket/coco" and assoc["FileSystemPath"] == "/"
    assert assoc["BatchImportMetaDataOnCreate"] is True
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_a_failure_after_the_file_system_was_made_rolls_back_everything(aws):
    from clustertool.core import state
    from tests.aws.fakes import client_error

    name = unique("roll")
    aws.faults.add("create_mount_target", client_error("MountTargetConflict", "CreateMountTarget"))
    code, out, err = aws.ct(*UP, "--name", name, "--shared-fs", "efs")
    assert code != 0 and "MountTargetConflict" in err
    assert "deleted EFS" in err and not state.exists(name)
    assert _efs(aws).describe_file_systems()["FileSystems"] == [] and aws.total_leaks(name) == 0


def test_sweep_removes_a_lost_clusters_file_systems_with_its_instances(aws, fsxw):
    from clustertool.core import state

    name = unique("lost")
    assert aws.ct(*UP, "--name", name, "--shared-fs", "efs", "--shared-fs", "fsx")[0] == 0
    state.state_path(name).unlink()  # this machine no longer knows it
    code, out, err = aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 0, err
    [found] = json.loads(out)["orphans"]
    assert len(found["resources"]["efs-file-system"]) == 1 and len(found["resources"]["fsx-file-system"]) == 1
    assert _efs(aws).describe_file_systems()["FileSystems"] == []
    assert _fsx(aws).describe_file_systems()["FileSystems"] == []
    assert aws.total_leaks(name) == 0, aws.leaks(name)


@pytest.mark.parametrize("args, line", [
    (("--shared-fs", "fsx", "--fsx-capacity", "1000"),
     "error: --fsx-capacity 1000: FSx for Lustre SCRATCH_2 takes 1200, 2400, or a multiple of 2400 GiB"),
    (("--shared-fs", "efs", "--fsx-import", "s3://b/p"), "error: --fsx-import goes with a new FSx file system"),
    (("--shared-fs", "fsx", "--fsx-import", "my-bucket/p"), "error: --fsx-import 'my-bucket/p': expected "
                                                            "s3://BUCKET[/PREFIX]"),
])
def test_bad_shared_fs_flags_are_one_line_and_make_nothing(aws, args, line):
    from clustertool.core import state

    name = unique("bad")
    code, out, err = aws.ct(*UP, "--name", name, *args)
    assert code != 0 and [x for x in err.splitlines() if x.startswith("error:")] == [line], err
    assert "Traceback" not in err and not state.exists(name) and aws.total_leaks(name) == 0


def test_dry_run_plans_and_prices_the_file_systems_and_makes_none(aws):
    name = unique("plan")
    code, out, err = aws.ct(*UP, "--name", name, "--dry-run", "--shared-fs", "efs", "--shared-fs", "fsx",
                            "--fsx-import", "s3://b/p", "--ami", aws.ec2.describe_images()["Images"][0]["ImageId"])
    assert code == 0, err
    assert "shared fs: new EFS at /shared (encrypted, general purpose, elastic throughput)" in out
    assert "shared fs: new FSx for Lustre at /shared2, 1200 GiB SCRATCH_2, s3://b/p imported (lazy load)" in out
    assert "about $168.00/month" in out
    assert "Lustre client:" in out
    assert _efs(aws).describe_file_systems()["FileSystems"] == [] and aws.total_leaks(name) == 0
