"""`up --access leader` (the default on AWS) against a moto server: the leader alone has a public
address, an Elastic IP tagged as the cluster's, and takes SSH from the caller; members have none and
no SSH rule for the caller; the Elastic IP goes at `down`, after a failed `up` and with a sweep."""

from __future__ import annotations

import pytest

from tests.aws.conftest import MY_IP
from tests.conftest import unique

pytestmark = pytest.mark.aws


def _tags(item: dict) -> dict:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def _role(inst: dict) -> str:
    return _tags(inst)["clustertool:role"]


def _groups(aws, name) -> dict[str, dict]:
    found = aws.ec2.describe_security_groups(Filters=[{"Name": "tag:clustertool:cluster", "Values": [name]}])
    return {g["GroupName"]: g for g in found["SecurityGroups"]}


def _grab_run_instances(aws) -> dict:
    seen: dict = {}

    def grab(service, op, kwargs, call):
        if op == "run_instances" and not kwargs.get("DryRun"):
            seen.update(kwargs)
        return call()

    from clustertool.providers.aws import client

    client.HOOKS.insert(0, grab)
    return seen


def test_only_the_leader_gets_a_tagged_elastic_ip_and_ssh_from_the_caller_and_down_releases_it(aws):
    seen = _grab_run_instances(aws)
    name = unique("lead")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "3", "--instance-type", "g5.12xlarge", "--name", name, "--no-ssh")
    assert code == 0, err
    assert "access:   leader (only the leader takes SSH from here" in out and "Elastic IP" in err
    assert [i["AssociatePublicIpAddress"] for i in seen["NetworkInterfaces"]] == [False]
    instances = aws.instances(name)
    leader = next(i for i in instances if _role(i) == "leader")
    members = [i for i in instances if _role(i) == "member"]
    assert len(members) == 2 and not any(m.get("PublicIpAddress") for m in members)
    addresses = aws.ec2.describe_addresses()["Addresses"]
    assert len(addresses) == 1
    eip = addresses[0]
    primary = next(e["NetworkInterfaceId"] for e in leader["NetworkInterfaces"] if e["Attachment"]["DeviceIndex"] == 0)
    assert leader["PublicIpAddress"] == eip["PublicIp"] and eip["NetworkInterfaceId"] == primary
    tags = _tags(eip)
    assert tags["clustertool:cluster"] == name and tags["clustertool:id"].startswith(name + "-")
    assert tags["clustertool:owner"] and tags["clustertool:home"] and tags["Name"] == f"{name}-leader"

    groups = _groups(aws, name)
    cluster_group = next(g for n, g in groups.items() if not n.endswith("-leader"))
    leader_group = next(g for n, g in groups.items() if n.endswith("-leader"))
    assert [p["IpProtocol"] for p in cluster_group["IpPermissions"]] == ["-1"]  # members talk; no SSH from you
    assert cluster_group["IpPermissions"][0]["UserIdGroupPairs"][0]["GroupId"] == cluster_group["GroupId"]
    ssh = [(p["FromPort"], r["CidrIp"]) for p in leader_group["IpPermissions"] for r in p["IpRanges"]]
    assert ssh == [(22, f"{MY_IP}/32")]
    enis = aws.ec2.describe_network_interfaces(Filters=[{"Name": "attachment.instance-id",
                                                         "Values": [i["InstanceId"] for i in instances]}])
    in_groups = {e["Attachment"]["InstanceId"]: {g["GroupId"] for g in e["Groups"]} for e in enis["NetworkInterfaces"]}
    assert in_groups[leader["InstanceId"]] == {cluster_group["GroupId"], leader_group["GroupId"]}
    assert all(in_groups[m["InstanceId"]] == {cluster_group["GroupId"]} for m in members)

    from clustertool.core import state

    saved = state.load(name)
    assert saved.options["access"] == "leader"
    assert saved.leader.ssh_host == eip["PublicIp"] and all(m.ssh_host in (None, m.address) for m in saved.members)
    code, out, _ = aws.ct("status", "-c", name, "--no-check")
    assert code == 0 and "access: leader" in out
    assert aws.leaks(name)["addresses"] == 1

    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"released Elastic IP {eip['AllocationId']}" in out + err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert aws.ec2.describe_addresses()["Addresses"] == []


def test_access_all_gives_every_node_a_public_ip_and_no_elastic_ip(aws):
    seen = _grab_run_instances(aws)
    name = unique("all")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name,
                          "--no-ssh", "--access", "all")
    assert code == 0, err
    assert [i["AssociatePublicIpAddress"] for i in seen["NetworkInterfaces"]] == [True]
    assert all(i.get("PublicIpAddress") for i in aws.instances(name))
    assert aws.leaks(name)["addresses"] == 0 and aws.leaks(name)["security_groups"] == 1
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


@pytest.mark.parametrize("fail_at, after", [("associate_address", False), ("describe_instance_status", False),
                                            ("allocate_address", True)])
def test_a_failed_up_releases_the_elastic_ip_with_everything_else(aws, fail_at, after):
    from tests.aws.fakes import client_error

    aws.faults.add(fail_at, client_error("InternalError", fail_at, "boom"), after=after, times=5)
    name = unique("eipfail")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name, "--no-ssh")
    assert code != 0 and "Traceback" not in err
    assert fail_at in aws.faults.fired
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert aws.ec2.describe_addresses()["Addresses"] == []


def test_a_lost_state_sweep_releases_the_elastic_ip(aws):
    from clustertool.core import state

    name = unique("eipsweep")
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name, "--no-ssh")[0] == 0
    state.state_path(name).unlink()
    code, out, err = aws.ct("down", "--sweep", "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert aws.ec2.describe_addresses()["Addresses"] == []


def test_efa_leader_gets_its_elastic_ip_on_the_primary_interface(aws):
    name = unique("efa")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--efa")
    assert code == 0, err
    eip = aws.ec2.describe_addresses()["Addresses"][0]
    eni = aws.ec2.describe_network_interfaces(NetworkInterfaceIds=[eip["NetworkInterfaceId"]])["NetworkInterfaces"][0]
    assert eni["Attachment"]["DeviceIndex"] == 0 and eni["Attachment"].get("NetworkCardIndex", 0) == 0
    assert _role(next(i for i in aws.instances(name) if i["InstanceId"] == eni["Attachment"]["InstanceId"])) == "leader"
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_jump_makes_no_public_address_and_admits_ssh_from_the_vpc_range(aws):
    seen = _grab_run_instances(aws)
    name = unique("jump")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name,
                            "--jump", "ops@bastion.example.com", "--dry-run")
    assert code == 0, err
    assert "the leader is reached through --jump ops@bastion.example.com (no public address)" in out
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", name,
                          "--no-ssh", "--jump", "ops@bastion.example.com")
    assert code == 0, err
    assert [i["AssociatePublicIpAddress"] for i in seen["NetworkInterfaces"]] == [False]
    assert not any(i.get("PublicIpAddress") for i in aws.instances(name))
    assert aws.leaks(name)["addresses"] == 0
    vpc = aws.ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
    leader_group = next(g for n, g in _groups(aws, name).items() if n.endswith("-leader"))
    assert [r["CidrIp"] for p in leader_group["IpPermissions"] for r in p["IpRanges"]] == [vpc["CidrBlock"]]
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


@pytest.mark.parametrize("args, expected", [
    (("--access", "some"), "--access"), (("--jump", "ops@-oProxyCommand"), "--jump"),
])
def test_bad_access_flags_are_one_line(aws, args, expected):
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.12xlarge", "--name", unique("bad"),
                          *args)
    assert code != 0 and expected in err and "Traceback" not in err
