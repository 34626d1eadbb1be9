"""Pure parts of the aws provider: request building, parsing, prices, CIDRs (no AWS, no moto)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clustertool.core.errors import UsageError
from clustertool.providers.aws import adopt, az_launch, capacity, instances, lease, network, owner, pricing, quota, tags
from clustertool.providers.aws.client import hint_for
from clustertool.providers.aws.images import Image

pytestmark = pytest.mark.unit
IMAGE = Image("ami-1", "dlami", "/dev/sda1", "test")
STAMP = tags.Stamp("c", "c-abc123", owner="arn:aws:iam::1:user/u", home="h1", lease="1900000000", created="1.5")


def _params(efa_interfaces=0, **options):
    return az_launch.launch_params(stamp=STAMP, count=4, instance_type="p4d.24xlarge", image=IMAGE, subnet="subnet-1",
                                group_id="sg-1", key_name="k", az="us-east-1b", placement_group="pg",
                                options=options, token="tok", efa_interfaces=efa_interfaces)


def test_launch_params_ask_for_all_n_at_once_in_one_az_and_group():
    p = _params()
    assert (p["MinCount"], p["MaxCount"]) == (4, 4)
    assert p["Placement"] == {"AvailabilityZone": "us-east-1b", "GroupName": "pg"}
    assert p["NetworkInterfaces"][0]["Groups"] == ["sg-1"] and "InterfaceType" not in p["NetworkInterfaces"][0]
    assert p["BlockDeviceMappings"] == [{"DeviceName": "/dev/sda1", "Ebs": {
        "VolumeSize": 200, "VolumeType": "gp3", "DeleteOnTermination": True, "Iops": 10000}}]
    assert "InstanceMarketOptions" not in p
    found = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]} for s in p["TagSpecifications"]}
    identity = {"clustertool:cluster": "c", "clustertool:id": "c-abc123", "clustertool:owner": "arn:aws:iam::1:user/u",
                "clustertool:home": "h1", "clustertool:lease": "1900000000", "clustertool:created": "1.5"}
    assert found["instance"] == {**identity, "clustertool:role": "member"}
    assert found["volume"] == found["network-interface"] == identity


def test_launch_params_efa_spot_io1_and_gp2():
    p = _params(efa=True, spot=True, volume_type="io1", iops=20000, volume_size=500)
    assert p["NetworkInterfaces"][0]["InterfaceType"] == "efa"
    assert p["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is True  # one interface: a public IP
    assert p["InstanceMarketOptions"]["MarketType"] == "spot"
    ebs = p["BlockDeviceMappings"][0]["Ebs"]
    assert ebs["Iops"] == 20000 and ebs["VolumeSize"] == 500
    assert "Iops" not in _params(volume_type="gp2")["BlockDeviceMappings"][0]["Ebs"]


@pytest.mark.parametrize("text, cidr", [("203.0.113.7", "203.0.113.7/32"), ("10.0.0.0/8", "10.0.0.0/8"),
                                        ("10.1.2.3/8", "10.0.0.0/8"), ("2001:db8::1", "2001:db8::1/128")])
def test_parse_cidr_accepts_addresses_and_blocks(text, cidr):
    assert network.parse_cidr(text) == cidr


@pytest.mark.parametrize("text", ["", "10.0.0.300/8", "foo", "10.0.0.0/33", "0.0.0.0/0 ; rm -rf"])
def test_parse_cidr_rejects_garbage(text):
    with pytest.raises(UsageError):
        network.parse_cidr(text)


def test_security_rules_are_self_reference_and_ssh_from_the_cidr_only():
    rules = network.security_rules("sg-9", "203.0.113.7/32")
    assert rules[0] == {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-9", "Description": "cluster members"}]}
    assert rules[1]["FromPort"] == rules[1]["ToPort"] == 22
    assert rules[1]["IpRanges"][0]["CidrIp"] == "203.0.113.7/32"
    assert "Ipv6Ranges" in network.security_rules("sg-9", "2001:db8::/64")[1]


def test_caller_cidr_uses_the_env_override_then_a_public_ssh_client(monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_MY_IP", "198.51.100.4")
    assert network.caller_cidr()[0] == "198.51.100.4/32"
    monkeypatch.delenv("CLUSTERTOOL_MY_IP")
    monkeypatch.setattr(network, "_route_source", lambda: None)
    monkeypatch.setenv("SSH_CONNECTION", "8.8.4.4 51000 10.0.0.5 22")
    assert network.caller_cidr()[0] == "8.8.4.4/32"
    monkeypatch.setenv("SSH_CONNECTION", "192.168.1.9 51000 10.0.0.5 22")
    assert network.caller_cidr() is None


def test_host_keys_come_from_the_cloud_init_console_block():
    console = ("boot...\n-----BEGIN SSH HOST KEY KEYS-----\n"
               "ecdsa-sha2-nistp256 AAAAE2V root@ip-1\nssh-ed25519 AAAAC3Nz root@ip-1\n"
               "-----END SSH HOST KEY KEYS-----\nlogin:")
    assert instances.host_keys_from_console(console) == ["ecdsa-sha2-nistp256 AAAAE2V", "ssh-ed25519 AAAAC3Nz"]
    assert instances.host_keys_from_console("no keys here") == []


def test_adopt_parsers():
    assert adopt.parse_tag("Name=john,paul, george ,ringo") == ("Name", ["john", "paul", "george", "ringo"])
    assert adopt.parse_ids("i-0123456789abcdef0,i-01234567") == ["i-0123456789abcdef0", "i-01234567"]
    for bad in ("Name=", "=x", "john"):
        with pytest.raises(UsageError):
            adopt.parse_tag(bad)
    with pytest.raises(UsageError):
        adopt.parse_ids("i-1;reboot")


def test_prices_say_their_basis_and_multiply_by_count():
    total, basis = pricing.hourly("p4d.24xlarge", 4)
    assert round(total, 2) == 131.09 and "approximate us-east-1" in basis
    assert pricing.hourly("x9.huge", 2)[0] is None
    assert pricing.hourly("p4d.24xlarge", 2, spot_price=10.0, is_spot=True)[0] == 20.0
    assert pricing.cost_so_far(10.0, 1000.0, now=1000.0 + 1800) .startswith("$5.00")


@pytest.mark.parametrize("code, words", [("AuthFailure", "credentials"), ("UnauthorizedOperation", "IAM"),
                                         ("VcpuLimitExceeded", "quota"), ("InsufficientInstanceCapacity", "capacity"),
                                         ("InvalidInstanceType", "instance type"),
                                         ("RequestLimitExceeded", "throttling")])
def test_every_error_class_has_a_hint(code, words):
    assert words in hint_for(code)


def test_help_and_provider_import_do_not_import_boto3():
    code = ("import sys; from clustertool.cli import app; import clustertool.providers.aws.aws_provider; "
            "app.run(['up', '--help']); print('boto3' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stderr.strip().splitlines()[-1] == "False"


def test_wait_ssh_port_returns_when_a_loopback_listener_answers_and_times_out_otherwise(monkeypatch):
    import socket

    from clustertool.core.errors import ProviderError

    monkeypatch.setenv("CLUSTERTOOL_AWS_POLL", "0.01")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        instances.wait_ssh_port(["127.0.0.1"], port=port, timeout=5)
    with pytest.raises(ProviderError, match="not answering"):
        instances.wait_ssh_port(["127.0.0.1"], port=port, timeout=0.1)


def test_with_an_existing_key_pair_the_cluster_key_rides_in_cloud_init_user_data():
    p = az_launch.launch_params(stamp=STAMP, count=1, instance_type="g5.xlarge", image=IMAGE, subnet="s", group_id="g",
                             key_name="mine", az="a", placement_group=None, options={"key_name": "mine"},
                             token="t", public_key="ssh-ed25519 AAAAC3 c@clustertool\n")
    assert p["KeyName"] == "mine"
    assert p["UserData"] == "#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3 c@clustertool\n"
    assert "UserData" not in _params()


def _type(name, cards, efa_max, efa=True, vcpus=96):
    return capacity.parse_type({"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus}, "NetworkInfo": {
        "EfaSupported": efa, "EfaInfo": {"MaximumEfaInterfaces": efa_max}, "MaximumNetworkCards": cards,
        "NetworkCards": [{"NetworkCardIndex": i} for i in range(cards)]}})


def test_efa_gets_one_interface_per_network_card_and_then_no_public_ip():
    assert (_type("p4d.24xlarge", 4, 4).efa_interfaces, _type("p5.48xlarge", 32, 32).efa_interfaces) == (4, 32)
    assert _type("g5.48xlarge", 1, 1).efa_interfaces == 1 and _type("g4dn.xlarge", 1, 0, efa=False).efa_interfaces == 0
    ifaces = _params(efa=True, efa_interfaces=4)["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"]) for i in ifaces] == [(0, 0), (1, 1), (2, 1), (3, 1)]
    assert {i["InterfaceType"] for i in ifaces} == {"efa"} and all(i["Groups"] == ["sg-1"] for i in ifaces)
    assert not any("AssociatePublicIpAddress" in i for i in ifaces)
    assert len(_params(efa_interfaces=4)["NetworkInterfaces"]) == 1  # without --efa: one plain interface


@pytest.mark.parametrize("itype, spot, code", [
    ("p4d.24xlarge", False, "L-417A185B"), ("p5.48xlarge", True, "L-7212CCBC"), ("g5.12xlarge", False, "L-DB2E81BA"),
    ("vt1.3xlarge", False, "L-DB2E81BA"), ("g6.xlarge", True, "L-3819A6DF"), ("trn1.32xlarge", False, "L-2C3B7624"),
    ("inf2.xlarge", False, "L-1945791B"), ("m5.large", False, "L-1216C47A"), ("c7gn.16xlarge", True, "L-34B43A08"),
    ("dl1.24xlarge", False, "L-6E869C2A"), ("hpc7g.16xlarge", False, "L-F7808C92"), ("u-6tb1.metal", False, None)])
def test_quota_codes_by_family(itype, spot, code):
    found = quota.quota_code(itype, spot)
    assert (found[0] if found else None) == code


def test_quota_fits_counts_what_runs():
    q = quota.Quota(384, "vCPUs", "P", "Service Quotas", used=192, need=192)
    assert q.fits() and not quota.Quota(384, "vCPUs", "P", "x", used=193, need=192).fits()


def test_owner_is_the_principal_without_a_session_name_plus_the_home():
    arn = "arn:aws:sts::123456789012:assumed-role/Admin/alice-session-1"
    assert owner.principal(arn) == "arn:aws:sts::123456789012:assumed-role/Admin"
    me = owner.Owner(owner.principal(arn), "h1")
    assert me.matches("arn:aws:sts::123456789012:assumed-role/Admin/other-session", "h1")
    assert not me.matches(arn, "h2") and not me.matches("arn:aws:iam::123456789012:user/bob", "h1")


def test_a_stamp_finds_its_own_resources_by_id_and_an_old_state_only_untagged_ones():
    assert STAMP.filter() == [{"Name": "tag:clustertool:id", "Values": ["c-abc123"]}]
    assert STAMP.owns([{"Key": "clustertool:id", "Value": "c-abc123"}])
    assert not STAMP.owns([{"Key": "clustertool:id", "Value": "c-zzz999"}])
    old = tags.Stamp("c")
    assert old.filter() == [{"Name": "tag:clustertool:cluster", "Values": ["c"]}]
    assert old.owns([{"Key": "clustertool:cluster", "Value": "c"}])
    assert not old.owns([{"Key": "clustertool:cluster", "Value": "c"}, {"Key": "clustertool:id", "Value": "c-1"}])


def test_a_lease_is_done_live_or_expired():
    assert lease.summarize(["100", "done", "300"]) == "done"
    assert lease.summarize(["100", "300", "junk"]) == 300.0 and lease.summarize([]) is None
    assert lease.live(300.0, now=200) and not lease.live(300.0, now=400) and not lease.live("done")
    assert "in flight" in lease.describe(300.0, now=200) and "died" in lease.describe(300.0, now=400)


def test_access_leader_launches_without_public_ips_and_access_all_with_them():
    from clustertool.providers.aws import leader

    assert _params(access="leader")["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False
    assert _params(access="all")["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is True
    assert _params(access="all", jump="ops@b")["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False
    assert (leader.gets_elastic_ip({"access": "leader"}), leader.gets_elastic_ip({"access": "leader", "jump": "b"}),
            leader.gets_elastic_ip({"access": "all"})) == (True, False, False)


def test_the_members_group_has_no_ssh_rule_and_the_leaders_has_only_ssh():
    assert network.security_rules("sg-1", None) == [
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1", "Description": "cluster members"}]}]
    assert network.ssh_rules("203.0.113.7/32") == [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [
        {"CidrIp": "203.0.113.7/32", "Description": "clustertool ssh"}]}]
    assert network.describe_rules(None)[1] == "no inbound SSH rule (members)"


def test_the_elastic_ip_goes_on_the_primary_interface_of_card_zero():
    from clustertool.core.errors import ProviderError
    from clustertool.providers.aws import leader

    inst = {"InstanceId": "i-1", "NetworkInterfaces": [
        {"NetworkInterfaceId": "eni-b", "Attachment": {"DeviceIndex": 1, "NetworkCardIndex": 1}},
        {"NetworkInterfaceId": "eni-a", "Attachment": {"DeviceIndex": 0, "NetworkCardIndex": 0}}]}
    assert leader.primary_interface(inst) == "eni-a"
    with pytest.raises(ProviderError):
        leader.primary_interface({"InstanceId": "i-2", "NetworkInterfaces": []})
    lines = leader.plan_lines({"access": "leader"}, ("203.0.113.7/32", "CLUSTERTOOL_MY_IP"), "c")
    assert "Elastic IP" in lines[0] and "inbound tcp/22 (SSH) from 203.0.113.7/32 (CLUSTERTOOL_MY_IP)" in lines[1]
    assert leader.plan_lines({"access": "all"}, ("1.2.3.4/32", "x"), "c") == [
        "access: all: every node gets a public IP and takes SSH from 1.2.3.4/32 (x)"]
