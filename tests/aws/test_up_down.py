"""Up and down against a moto server, through the tool's own CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.aws.conftest import MY_IP
from tests.conftest import unique

pytestmark = pytest.mark.aws


def _tags(inst: dict) -> dict:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def test_up_four_p4d_lands_in_one_az_tagged_writes_slots_8_and_down_leaves_nothing(aws, tmp_path):
    code, out, err = aws.ct("up", "--provider", "aws", "--nodes", "4", "--instance-type", "p4d.24xlarge",
                            "--name", "t", "--no-ssh")
    assert code == 0, err
    instances = aws.instances("t")
    assert len(instances) == 4
    assert len({i["Placement"]["AvailabilityZone"] for i in instances}) == 1
    tags = sorted((_tags(i) for i in instances), key=lambda t: int(t["clustertool:node"]))
    assert [t["Name"] for t in tags] == ["t-leader", "t-node-2", "t-node-3", "t-node-4"]
    assert [t["clustertool:role"] for t in tags] == ["leader", "member", "member", "member"]
    assert all(t["clustertool:cluster"] == "t" for t in tags)
    hostfile = (tmp_path / "hostfiles" / "t").read_text().splitlines()
    lines = [line for line in hostfile if line.strip() and not line.startswith("#")]
    leader = next(i for i in instances if _tags(i)["clustertool:role"] == "leader")
    assert len(lines) == 4 and all(line.endswith("slots=8") for line in lines)
    assert lines[0].split()[0] == leader["PrivateIpAddress"]
    assert "image: ami-" in err and "hourly" in err
    assert aws.leaks("t") == {"instances": 4, "security_groups": 2, "key_pairs": 1, "volumes": 4,
                              "placement_groups": 1, "network_interfaces": 4, "addresses": 1}  # --access leader

    code, out, err = aws.ct("down", "-c", "t", "--yes")
    assert code == 0, err
    assert aws.total_leaks("t") == 0, aws.leaks("t")
    assert not (tmp_path / "hostfiles" / "t").exists()


def test_up_sets_volumes_security_rules_key_pair_and_placement_group(aws):
    name = unique("vol")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name,
                          "--no-ssh", "--volume-size", "300", "--iops", "12000", "--access", "all")
    assert code == 0, err
    vols = aws.ec2.describe_volumes(Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])["Volumes"]
    assert sorted(v["Size"] for v in vols) == [300, 300] and {v["VolumeType"] for v in vols} == {"gp3"}
    run = next(i for i, op in enumerate(aws.recorder.ops) if op == "run_instances")
    assert run >= 0
    group = aws.ec2.describe_security_groups(
        Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])["SecurityGroups"][0]
    perms = group["IpPermissions"]
    self_rule = [p for p in perms if p["IpProtocol"] == "-1"]
    ssh_rule = [p for p in perms if p.get("FromPort") == 22]
    assert self_rule and self_rule[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]
    assert [r["CidrIp"] for r in ssh_rule[0]["IpRanges"]] == [f"{MY_IP}/32"]
    assert not any(r.get("CidrIp") == "0.0.0.0/0" for p in perms for r in p.get("IpRanges", []))
    instances = aws.instances(name)
    assert {i["KeyName"] for i in instances} == {aws.ec2.describe_key_pairs(
        Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])["KeyPairs"][0]["KeyName"]}
    assert len(aws.pgs.tagged(name)) == 1
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_run_instances_request_carries_volume_iops_efa_per_card_placement_and_tags(aws):
    """The RunInstances request as sent (recorded at the client seam: moto drops io1 IOPS and EFA).
    p4d.24xlarge has 4 network cards: 4 EFA interfaces, none asking for a public IP (AWS refuses
    that with several interfaces); down removes every interface (moto keeps the secondary ones
    of a terminated instance, which makes this a real check)."""
    seen = {}

    def grab(service, op, kwargs, call):
        if op == "run_instances" and not kwargs.get("DryRun"):
            seen.update(kwargs)
        return call()

    from clustertool.providers.aws import client

    client.HOOKS.insert(0, grab)
    name = unique("req")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--efa", "--az", "us-east-1b")
    assert code == 0, err
    assert seen["MinCount"] == seen["MaxCount"] == 2
    assert seen["Placement"]["AvailabilityZone"] == "us-east-1b" and seen["Placement"]["GroupName"]
    ifaces = seen["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in ifaces] == [
        (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    assert not any("AssociatePublicIpAddress" in i for i in ifaces)
    assert all(i["DeleteOnTermination"] for i in ifaces)
    assert "4 EFA interfaces per node" in aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge",
                                                 "--name", unique("plan"), "--efa", "--dry-run")[1]
    assert aws.leaks(name)["network_interfaces"] == 8
    ebs = seen["BlockDeviceMappings"][0]["Ebs"]
    assert (ebs["VolumeSize"], ebs["VolumeType"], ebs["Iops"], ebs["DeleteOnTermination"]) == (200, "gp3", 10000, True)
    kinds = {s["ResourceType"] for s in seen["TagSpecifications"]}
    assert {"instance", "volume"} <= kinds
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_down_twice_first_interrupted_then_completed(aws):
    name = unique("twice")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g4dn.12xlarge", "--name", name, "--no-ssh")
    assert code == 0, err
    from tests.aws.fakes import client_error

    aws.faults.add("delete_security_group", client_error("InternalError", "DeleteSecurityGroup", "boom"))
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code != 0 and "Traceback" not in err
    assert aws.leaks(name)["instances"] == 0 and aws.leaks(name)["security_groups"] == 2  # the cluster's, the leader's
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0
    code, _, err = aws.ct("down", "-c", name, "--yes")  # the cluster is gone now: one clear line
    assert code != 0 and "no cluster named" in err and "Traceback" not in err


def test_terminate_is_idempotent_on_the_provider(aws):
    name = unique("idem")
    assert aws.ct("up", "-p", "aws", "-N", "1", "--instance-type", "g4dn.xlarge", "--name", name, "--no-ssh")[0] == 0
    from clustertool.core import state
    from clustertool.providers.aws.aws_provider import AwsProvider

    cluster = state.load(name)
    first = AwsProvider().terminate_instances(cluster)
    second = AwsProvider().terminate_instances(cluster)
    assert any("terminated 1 instance" in line for line in first)
    assert second == ["nothing of this cluster was left in AWS"]
    assert aws.total_leaks(name) == 0
    assert aws.ct("down", "-c", name, "--yes")[0] == 0


def test_down_while_instances_shut_down_waits_and_retries_dependency_violation(aws):
    """moto terminates at once and never refuses a busy security group, so the seam makes
    instances report shutting-down for a few polls and DeleteSecurityGroup answer
    DependencyViolation twice, as AWS does while instances are going away."""
    name = unique("shut")
    assert aws.ct("up", "-p", "aws", "-N", "3", "--instance-type", "g5.48xlarge", "--name", name, "--no-ssh")[0] == 0
    polls = {"n": 0}

    def shutting_down(service, op, kwargs, call):
        response = call()
        if op == "describe_instances" and "terminate_instances" in aws.recorder.ops and polls["n"] < 4:
            polls["n"] += 1
            for r in response["Reservations"]:
                for inst in r["Instances"]:
                    if inst["State"]["Name"] == "terminated":
                        inst["State"] = {"Code": 32, "Name": "shutting-down"}
        return response

    from clustertool.providers.aws import client
    from tests.aws.fakes import client_error

    client.HOOKS.append(shutting_down)
    aws.faults.add("delete_security_group", client_error("DependencyViolation", "DeleteSecurityGroup",
                                                         "resource has a dependent object"), times=2)
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert polls["n"] == 4
    assert aws.faults.fired.count("delete_security_group") == 2
    assert aws.recorder.ops.count("delete_security_group") == 4  # 2 refused, then the cluster's and the leader's
    assert aws.total_leaks(name) == 0


def test_dry_run_prints_the_plan_and_creates_nothing(aws, tmp_path):
    name = unique("dry")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", "p4d.24xlarge", "--name", name,
                            "--dry-run")
    assert code == 0, err
    assert "us-east-1a, us-east-1b" in out
    assert "image: ami-" in out and "200 GB gp3, 10000 IOPS" in out
    assert f"inbound tcp/22 (SSH) from {MY_IP}/32 (CLUSTERTOOL_MY_IP)" in out and "no inbound SSH rule" in out
    assert "only the leader gets a public address: an Elastic IP" in out
    assert "$131.09/h" in out and "approximate us-east-1" in out
    assert "RunInstances of 4 x p4d.24xlarge in us-east-1a: would succeed" in out
    assert "CreateSecurityGroup: would succeed" in out
    assert aws.total_leaks(name) == 0
    assert not any(op in aws.recorder.ops for op in ("import_key_pair", "authorize_security_group_ingress"))
    assert aws.pgs.created == []
    assert not (tmp_path / "cthome" / "clusters" / f"{name}.json").exists()


def test_status_shows_hourly_price_and_cost_so_far(aws):
    name = unique("cost")
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name, "--no-ssh")[0] == 0
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0, err
    assert "hourly price: $65.55/h" in out and "cost so far: $" in out
    assert out.count("running") == 2
    assert aws.ct("down", "-c", name, "--yes")[0] == 0


def test_stop_keeps_disks_and_start_refreshes_nodes_and_hostfile(aws, tmp_path):
    name = unique("stop")
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name, "--no-ssh")[0] == 0
    volumes_before = aws.leaks(name)["volumes"]
    code, _, err = aws.ct("stop", "-c", name)
    assert code == 0, err
    assert {i["State"]["Name"] for i in aws.instances(name)} == {"stopped"}
    assert aws.leaks(name)["volumes"] == volumes_before == 2
    code, out, _ = aws.ct("status", "-c", name, "--no-check")
    assert code == 0 and "compute not billed while stopped" in out and out.count("stopped") >= 2
    hostfile = Path(tmp_path / "hostfiles" / name)
    hostfile.unlink()
    code, _, err = aws.ct("start", "-c", name)
    assert code == 0, err
    assert {i["State"]["Name"] for i in aws.instances(name)} == {"running"}
    assert hostfile.exists() and hostfile.read_text().count("slots=1") == 2
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_done_when_through_the_installed_command_against_plain_moto(aws, tmp_path):
    """No seam here: a separate `clustertool` process talks to the moto server alone. moto
    lacks placement groups, so up says it launches without one; everything else is real."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    run = lambda *a: subprocess.run([sys.executable, "-m", "clustertool", *a], env=env, cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    up = run("up", "--provider", "aws", "--nodes", "4", "--instance-type", "p4d.24xlarge", "--name", "t", "--no-ssh")
    assert up.returncode == 0, up.stderr
    assert "launching without a cluster placement group" in up.stderr
    assert [line.split()[1] for line in (tmp_path / "hostfiles" / "t").read_text().splitlines()] == ["slots=8"] * 4
    assert aws.leaks("t")["instances"] == 4
    down = run("down", "-c", "t", "--yes")
    assert down.returncode == 0, down.stderr
    assert aws.total_leaks("t") == 0


def test_host_keys_are_pinned_from_console_output_when_it_carries_them(aws):
    """moto's console output has no cloud-init key block; the seam returns one, base64 as EC2 does."""
    import base64

    def console(service, op, kwargs, call):
        if op != "get_console_output":
            return call()
        text = ("-----BEGIN SSH HOST KEY KEYS-----\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"
                + kwargs["InstanceId"][-6:] + " root@ip\n-----END SSH HOST KEY KEYS-----\n")
        return {"InstanceId": kwargs["InstanceId"], "Output": base64.b64encode(text.encode()).decode()}

    from clustertool.core import state
    from clustertool.providers.aws import client

    client.HOOKS.insert(0, console)
    name = unique("keys")
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name, "--no-ssh")[0] == 0
    nodes = state.load(name).nodes
    expected = [[f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{n.instance_id[-6:]}"] for n in nodes]
    assert [n.host_keys for n in nodes] == expected
    assert aws.ct("down", "-c", name, "--yes")[0] == 0


def test_spot_cluster_from_a_yaml_spec_prices_spot_and_refuses_stop(aws, tmp_path):
    name = unique("spot")
    spec = tmp_path / "cluster.yaml"
    spec.write_text(f"name: {name}\nprovider: aws\nnodes: 2\ninstance_type: g5.48xlarge\nspot: true\n"
                    "volume_size: 250\nssh_cidr: 198.51.100.0/24\n")
    code, _, err = aws.ct("up", str(spec), "--no-ssh")
    assert code == 0, err
    assert {i.get("InstanceLifecycle") for i in aws.instances(name)} == {"spot"}
    groups = aws.ec2.describe_security_groups(
        Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])["SecurityGroups"]
    assert [r["CidrIp"] for g in groups for p in g["IpPermissions"] if p.get("FromPort") == 22
            for r in p["IpRanges"]] == ["198.51.100.0/24"]
    code, out, _ = aws.ct("status", "-c", name, "--no-check")
    assert code == 0 and "current spot price" in out
    code, _, err = aws.ct("stop", "-c", name)
    assert code != 0 and "cannot stop one-time spot instances" in err
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_an_existing_key_pair_is_used_and_never_deleted(aws):
    """The user's key pair is made with boto3 here, standing in for the console."""
    aws.ec2.create_key_pair(KeyName="mine")
    name = unique("kn")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name, "--no-ssh",
                          "--key-name", "mine")
    assert code == 0, err
    assert {i["KeyName"] for i in aws.instances(name)} == {"mine"}
    assert "import_key_pair" not in aws.recorder.ops
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert [k["KeyName"] for k in aws.ec2.describe_key_pairs()["KeyPairs"]] == ["mine"]
    assert aws.total_leaks(name) == 0
