"""The AWS kinds' mount commands, built from what the EFS / FSx APIs answered (pure), and the request
checks and prices of providers/aws/filesystems.py."""

from __future__ import annotations

import subprocess

import pytest

from clustertool.core.errors import ProviderError, UsageError
from clustertool.providers.aws import efs, filesystems, fsx, tags
from clustertool.sharedfs import argv, cloudmounts

EFS = {"kind": "efs", "id": "fs-0abc", "mount": "/shared", "made": True, "mount_name": None,
       "dns": efs.dns_name("fs-0abc", "eu-west-1")}
FSX = {"kind": "fsx", "id": "fs-0def", "mount": "/data", "made": True,
       "dns": "fs-0def.fsx.us-east-1.amazonaws.com", "mount_name": "abcdef12"}  # DNSName, MountName as FSx has them


def _target(fs: dict) -> argv.MountTarget:
    return argv.MountTarget(fs=fs, cluster="c", node="node-2", is_leader=False, leader_address="10.0.0.1",
                              user="ubuntu")


def test_efs_mounts_with_the_nfs_options_aws_documents_from_the_dns_name():
    cmd = argv.mount_command(_target(EFS))
    assert cmd.argv == ["mount", "-t", "nfs4", "-o",
                        "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport",
                        "fs-0abc.efs.eu-west-1.amazonaws.com:/", "/shared"]
    assert cmd.fstab == ("fs-0abc.efs.eu-west-1.amazonaws.com:/ /shared nfs4 nfsvers=4.1,rsize=1048576,"
                         "wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev,nofail 0 0")
    assert cmd.remote


def test_lustre_mounts_dns_at_tcp_slash_mount_name_with_a_boot_safe_fstab_line():
    cmd = argv.mount_command(_target(FSX))
    assert cmd.argv == ["mount", "-t", "lustre", "-o", "relatime,flock",
                        "fs-0def.fsx.us-east-1.amazonaws.com@tcp:/abcdef12", "/data"]
    assert cmd.fstab == ("fs-0def.fsx.us-east-1.amazonaws.com@tcp:/abcdef12 /data lustre "
                         "relatime,flock,_netdev,nofail 0 0")


def test_a_file_system_whose_up_did_not_finish_has_no_mount_command_but_one_line():
    with pytest.raises(ProviderError, match="no mount_name recorded"):
        argv.mount_command(_target({**FSX, "mount_name": None}))


def test_the_client_check_fails_in_one_line_naming_what_to_install_on_a_node_without_lustre():
    """Run for real here: this machine has no Lustre client (no mount.lustre, no lustre module)."""
    [check] = argv.mount_command(_target(FSX)).before
    done = subprocess.run(check, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    if done.returncode == 0:
        pytest.skip("this machine has a Lustre client")
    assert done.stdout.strip().splitlines() == [cloudmounts.LUSTRE_MISSING]
    assert "lustre-client-modules-$(uname -r)" in done.stdout


def test_the_client_check_passes_where_the_mount_helper_exists(tmp_path):
    helper = tmp_path / "mount.nfs4"
    helper.write_text("#!/bin/sh\n")
    helper.chmod(0o755)
    [check] = argv.mount_command(_target(EFS)).before
    done = subprocess.run(check, capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout == ""


def test_new_efs_is_encrypted_general_purpose_elastic_and_carries_the_cluster_tags():
    stamp = tags.Stamp("c", "c-1a2b3c", owner="arn:aws:iam::1:user/u", home="h", lease="99")
    params = efs.create_params("c-1a2b3c-efs1", stamp, "clustertool-c-1a2b3c-efs1")
    assert params["Encrypted"] is True and params["PerformanceMode"] == "generalPurpose"
    assert params["ThroughputMode"] == "elastic" and "ProvisionedThroughputInMibps" not in params
    values = tags.as_dict(params["Tags"])
    assert values[tags.ID] == "c-1a2b3c" and values[tags.CLUSTER] == "c" and values[tags.ROLE] == "shared-fs"


def test_fsx_import_goes_in_import_path_for_scratch_and_not_for_persistent_2():
    stamp = tags.Stamp("c", "c-1")
    scratch = fsx.create_params("t", stamp, "n", subnet="subnet-1", group="sg-1", capacity=1200,
                                deployment="SCRATCH_2", import_path="s3://b/p")
    assert scratch["LustreConfiguration"] == {"DeploymentType": "SCRATCH_2", "ImportPath": "s3://b/p",
                                              "AutoImportPolicy": "NEW_CHANGED_DELETED"}
    persistent = fsx.create_params("t", stamp, "n", subnet="subnet-1", group="sg-1", capacity=1200,
                                   deployment="PERSISTENT_2", import_path="s3://b/p")
    assert persistent["LustreConfiguration"] == {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125}
    assert fsx.association_params("fs-1", "s3://b/p")["DataRepositoryPath"] == "s3://b/p"


@pytest.mark.parametrize("gib, ok", [(1200, True), (2400, True), (4800, True), (3600, False), (1000, False)])
def test_fsx_capacity_takes_the_sizes_the_api_takes(gib, ok):
    if ok:
        fsx.check_capacity("SCRATCH_2", gib)
    else:
        with pytest.raises(UsageError, match="1200, 2400, or a multiple of 2400"):
            fsx.check_capacity("SCRATCH_2", gib)


@pytest.mark.parametrize("options, message", [
    ({"shared_fs": [{"kind": "local", "id": None, "mount": "/shared"}]}, "local provider's stand-in"),
    ({"fsx_capacity": 2400}, "--fsx-capacity goes with a new FSx"),
    ({"shared_fs": [{"kind": "fsx", "id": "fs-1", "mount": "/d"}], "fsx_import": "s3://b"}, "--fsx-import goes"),
    ({"shared_fs": [{"kind": "fsx", "id": None, "mount": "/d"}], "efs_throughput": "bursting"},
     "--efs-throughput goes with a new EFS"),
])
def test_flags_that_do_not_fit_the_request_are_refused(options, message):
    with pytest.raises(UsageError, match=message):
        filesystems.validate(options)


def test_prices_per_month_fsx_by_capacity_efs_by_data_stored():
    month = filesystems.monthly
    assert month({"kind": "fsx", "size_gib": 2400, "deployment": "SCRATCH_2"})[0] == pytest.approx(336.0)
    assert month({"kind": "fsx", "size_gib": 1200, "deployment": "PERSISTENT_2"})[0] == pytest.approx(174.0)
    assert month({"kind": "efs", "size_bytes": 100 * 10**9})[0] == pytest.approx(30.0)
    assert month({"kind": "efs"}) == (None, "$0.30/GB-month of data stored")


def test_the_plan_says_whether_the_image_has_a_lustre_client():
    options = {"shared_fs": [{"kind": "fsx", "id": None, "mount": "/data"}]}
    dlami = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)"
    assert "carries it" in filesystems.lustre_line(options, dlami)
    assert "lustre-client-modules" in filesystems.lustre_line(options, "ubuntu-jammy-22.04")
    assert filesystems.lustre_line({"shared_fs": [{"kind": "efs", "id": None, "mount": "/s"}]}, "x") is None


def test_efs_throughput_is_elastic_bursting_or_provisioned_with_a_rate():
    assert filesystems.throughput({}) == ("elastic", None)
    assert filesystems.throughput({"efs_throughput": "bursting"}) == ("bursting", None)
    assert filesystems.throughput({"efs_throughput": "provisioned:256"}) == ("provisioned", 256.0)
    for bad in ("provisioned", "provisioned:0", "fast"):
        with pytest.raises(UsageError, match="expected elastic, bursting or provisioned:MIBPS"):
            filesystems.throughput({"efs_throughput": bad})


def test_the_ledger_counts_shared_filesystems_while_up_and_while_stopped():
    from clustertool.cluster import ledger

    base = {"id": "c-1", "name": "c", "provider": "local", "type": "local", "nodes": 2, "storage_hourly": 0.25}
    events = [{**base, "t": 0.0, "event": "up"}, {**base, "t": 3600.0, "event": "stop"},
              {**base, "t": 3 * 3600.0, "event": "down"}]
    [c] = ledger.summarize(events, now=4 * 3600.0)
    assert c.hours_up == pytest.approx(1.0) and c.hours_stopped == pytest.approx(2.0)
    assert c.cost == pytest.approx(0.75)  # local nodes cost nothing; 3 h of file system at $0.25/h
    assert any("shared filesystems" in note for note in c.notes)


def test_waiting_for_a_file_system_reports_progress_and_ends_at_the_wait_timeout(monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_AWS_POLL", "0.001")
    monkeypatch.setenv("CLUSTERTOOL_AWS_TIMEOUT", "0.05")
    lines: list[str] = []
    polls = []
    with pytest.raises(ProviderError, match=r"FSx fs-1 to become available: not done after \d+s"):
        efs.wait_until("FSx fs-1 to become available", lambda: polls.append(1) is not None, lines.append, every=0.0)
    assert len(polls) > 1 and lines and all(line.startswith("waiting for FSx fs-1 to become available (")
                                            for line in lines)
