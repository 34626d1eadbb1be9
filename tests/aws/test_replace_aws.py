"""`replace` on AWS, against the moto server through the tool's own CLI: a new instance in the node's
zone, subnet, placement group and security groups, tagged as the cluster's, the old one terminated
(or with --keep-old stopped, tagged, listed and removed by `down`); the leader's Elastic IP moves;
no capacity is one line and makes nothing; Ctrl-C while waiting removes the new instance; a node whose
instance AWS already terminated is replaced from a sibling.  (--keep-old on spot is refused offline:
tests/unit/test_replace.py; signals at every AWS call: tests/aws/test_fault_matrix.py.)

moto's instances run no sshd, so the clusters are brought up with --no-ssh (as every AWS test is):
`replace` then writes hostfiles and wires no SSH.  The SSH part of a replacement (host key pinned,
the old one gone from every known_hosts, keys and hostfiles pushed) is the same code for every
provider and is proven on real sshd nodes by tests/local/test_replace.py."""

from __future__ import annotations

import json

import pytest

from tests.aws.fakes import client_error
from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "3", "--instance-type", "p4d.24xlarge", "--no-ssh")
IDENTITY = ("clustertool:cluster", "clustertool:id", "clustertool:owner", "clustertool:home", "clustertool:lease",
            "clustertool:created")


def _tags(inst: dict) -> dict:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def _by_node(aws, name: str) -> dict[str, dict]:
    return {_tags(i)["clustertool:node"]: i for i in aws.instances(name)
            if _tags(i).get("clustertool:role") != "replaced"}


def _groups(inst: dict) -> list[str]:
    primary = next(e for e in inst["NetworkInterfaces"] if e["Attachment"]["DeviceIndex"] == 0)
    return sorted(g["GroupId"] for g in primary["Groups"])


def _state(aws, iid: str) -> str:
    return aws.ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def _status(aws, name: str) -> dict:
    code, out, err = aws.ct("status", "-c", name, "--no-check", "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def launches(monkeypatch):
    """The RunInstances requests as sent (recorded at the client seam)."""
    from clustertool.providers.aws import client

    seen: list[dict] = []

    def grab(service, op, kwargs, call):
        if op == "run_instances" and not kwargs.get("DryRun"):
            seen.append(dict(kwargs))
        return call()
    monkeypatch.setattr(client, "HOOKS", [*client.HOOKS, grab])
    return seen


def test_replace_node_2_launches_like_it_in_its_zone_subnet_group_and_groups_terminates_the_old_and_down_leaves_nothing(
        aws, launches, tmp_path):
    name = unique("rp")
    code, _, err = aws.ct(*UP, "--name", name)
    assert code == 0, err
    before = _by_node(aws, name)
    old = before["2"]
    (group,) = aws.pgs.tagged(name)

    code, out, err = aws.ct("replace", "node-2", "--yes", "-c", name, "--json")
    assert code == 0, err
    (done,) = json.loads(out)["replaced"]
    after = _by_node(aws, name)
    new = after["2"]
    assert done["old_instance"] == old["InstanceId"] and done["new_instance"] == new["InstanceId"] != old["InstanceId"]
    assert _state(aws, old["InstanceId"]) == "terminated"
    assert {k: after[k]["InstanceId"] for k in ("1", "3")} == {k: before[k]["InstanceId"] for k in ("1", "3")}
    assert new["Placement"]["AvailabilityZone"] == old["Placement"]["AvailabilityZone"]
    assert new["SubnetId"] == old["SubnetId"] and _groups(new) == _groups(old)
    assert (new["InstanceType"], new["ImageId"], new["KeyName"]) == (old["InstanceType"], old["ImageId"],
                                                                     old["KeyName"])
    request = launches[-1]
    assert request["Placement"]["GroupName"] == group and request["MinCount"] == request["MaxCount"] == 1
    assert request["BlockDeviceMappings"] == launches[0]["BlockDeviceMappings"]  # 200 GB gp3, 10000 IOPS, as up
    assert request["NetworkInterfaces"] == launches[0]["NetworkInterfaces"]  # no public IP (--access leader), as up
    assert request["InstanceInitiatedShutdownBehavior"] == launches[0]["InstanceInitiatedShutdownBehavior"]
    new_tags, old_tags = _tags(new), _tags(old)
    assert {k: new_tags[k] for k in IDENTITY} == {k: old_tags[k] for k in IDENTITY}
    assert (new_tags["Name"], new_tags["clustertool:role"], new_tags["clustertool:node"]) == (
        f"{name}-node-2", "member", "2")
    assert new_tags["clustertool:replaces"] == old["InstanceId"]

    shown = {n["node"]: n for n in _status(aws, name)["nodes"]}
    assert shown["node-2"]["address"] == new["PrivateIpAddress"]
    hostfile = (tmp_path / "hostfiles" / name).read_text()
    assert new["PrivateIpAddress"] in hostfile and old["PrivateIpAddress"] not in hostfile
    assert aws.leaks(name)["instances"] == 3 and aws.leaks(name)["volumes"] == 3

    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_keep_old_stops_and_tags_the_old_instance_status_lists_it_sweep_counts_it_and_down_removes_it(aws):
    from clustertool.providers.aws import census
    from clustertool.providers.aws.client import Aws

    name = unique("rk")
    assert aws.ct(*UP, "--name", name)[0] == 0
    old = _by_node(aws, name)["3"]
    code, out, err = aws.ct("replace", "node-3", "--yes", "--keep-old", "-c", name)
    assert code == 0, err
    new = _by_node(aws, name)["3"]
    assert f"{new['InstanceId']} took the place of {old['InstanceId']}, which is stopped and kept" in out
    kept = aws.ec2.describe_instances(InstanceIds=[old["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert kept["State"]["Name"] == "stopped"
    assert _tags(kept)["clustertool:replaced-by"] == new["InstanceId"]
    assert _tags(kept)["Name"] == f"{name}-node-3-replaced"
    assert _status(aws, name)["node-3 old instance"].startswith(f"{old['InstanceId']} stopped and kept")
    code, text, _ = aws.ct("status", "-c", name, "--no-check")
    assert old["InstanceId"] in text and "`clustertool down` removes it" in text
    (found,) = [f for f in census.collect(Aws(region="us-east-1"), name).values()]
    assert old["InstanceId"] in found.resources["instance"] and len(found.resources["instance"]) == 4

    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert _state(aws, old["InstanceId"]) == "terminated" and aws.total_leaks(name) == 0, aws.leaks(name)


def test_replacing_the_leader_moves_its_elastic_ip_to_the_new_instance_and_it_stays_first_in_the_hostfile(
        aws, tmp_path):
    name = unique("rl")
    assert aws.ct(*UP, "--name", name)[0] == 0
    flt = [{"Name": "tag:clustertool:cluster", "Values": [name]}]
    (address,) = aws.ec2.describe_addresses(Filters=flt)["Addresses"]
    old = _by_node(aws, name)["1"]
    assert address["NetworkInterfaceId"] == old["NetworkInterfaces"][0]["NetworkInterfaceId"]
    code, _, err = aws.ct("replace", "leader", "--yes", "-c", name)
    assert code == 0, err
    new = _by_node(aws, name)["1"]
    assert _tags(new)["clustertool:role"] == "leader" and _tags(new)["Name"] == f"{name}-leader"
    assert len(_groups(new)) == 2 and _groups(new) == _groups(old)  # the cluster's and the leader's own
    (moved,) = aws.ec2.describe_addresses(AllocationIds=[address["AllocationId"]])["Addresses"]
    assert moved["NetworkInterfaceId"] == new["NetworkInterfaces"][0]["NetworkInterfaceId"]
    from clustertool.core import state

    leader = state.load(name).node("node-1")  # what ssh reaches it by: the same public address
    assert leader.instance_id == new["InstanceId"] and leader.ssh_host == address["PublicIp"]
    assert _state(aws, old["InstanceId"]) == "terminated"
    lines = [ln for ln in (tmp_path / "hostfiles" / name).read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0].split()[0] == new["PrivateIpAddress"] and len(lines) == 3
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_no_capacity_in_the_zone_is_one_line_naming_it_and_nothing_is_made(aws):
    from clustertool.core import state

    name = unique("rc")
    assert aws.ct(*UP, "--name", name)[0] == 0
    before = {k: i["InstanceId"] for k, i in _by_node(aws, name).items()}
    zone = _by_node(aws, name)["2"]["Placement"]["AvailabilityZone"]
    aws.faults.add("run_instances", client_error("InsufficientInstanceCapacity", "RunInstances",
                                                 "We currently do not have sufficient p4d.24xlarge capacity"))
    code, _, err = aws.ct("replace", "node-2", "--yes", "-c", name)
    assert code != 0 and aws.faults.fired == ["run_instances"]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and zone in errors[0] and "InsufficientInstanceCapacity" in errors[0], err
    assert "node-2 is unchanged" in errors[0] and "Traceback" not in err
    assert {k: i["InstanceId"] for k, i in _by_node(aws, name).items()} == before
    assert aws.leaks(name)["instances"] == 3
    assert "replacing" not in state.load(name).provider_state
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_ctrl_c_while_the_new_instance_is_awaited_terminates_it_and_the_node_stays_as_it_was(aws):
    from clustertool.core import state

    name = unique("ri")
    assert aws.ct(*UP, "--name", name)[0] == 0
    record = state.load(name)
    aws.faults.add("describe_instance_status", KeyboardInterrupt())
    code, _, err = aws.ct("replace", "node-2", "--yes", "-c", name)
    assert code != 0 and aws.faults.fired == ["describe_instance_status"]
    assert "terminating the new instance" in err
    now = state.load(name)
    assert [n.instance_id for n in now.nodes] == [n.instance_id for n in record.nodes]
    assert sorted(now.provider_state["instances"]) == sorted(record.provider_state["instances"])
    assert aws.leaks(name)["instances"] == 3 and "replacing" not in now.provider_state
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_a_node_whose_instance_aws_already_terminated_is_replaced_from_a_sibling_and_the_recorded_state(
        aws, launches):
    """A spot reclaim or a retired host: the old instance is gone, so its zone, subnet, type, image and
    key come from a live sibling, its security group and placement group from the state (through the
    Python API, ``Cluster.replace``)."""
    name = unique("rd")
    assert aws.ct(*UP, "--name", name)[0] == 0
    old = _by_node(aws, name)["3"]
    aws.ec2.terminate_instances(InstanceIds=[old["InstanceId"]])
    from clustertool import Cluster
    from clustertool.core import state

    lines: list[str] = []
    (done,) = Cluster(state.load(name), report=lines.append).replace("node-3").replaced  # the Python API
    assert f"node-3: the old instance {old['InstanceId']} is already gone" in lines
    new = _by_node(aws, name)["3"]
    assert (done.old_instance, done.new_instance, done.kept_old) == (old["InstanceId"], new["InstanceId"], False)
    assert (new["Placement"]["AvailabilityZone"], new["SubnetId"], _groups(new), new["InstanceType"]) == (
        old["Placement"]["AvailabilityZone"], old["SubnetId"], _groups(old), old["InstanceType"])
    assert launches[-1]["Placement"]["GroupName"] == aws.pgs.tagged(name)[0]
    assert _tags(new)["Name"] == f"{name}-node-3" and _tags(new)["clustertool:role"] == "member"
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_the_instance_of_a_replace_killed_while_waiting_is_removed_by_the_next_replace(aws, monkeypatch):
    """A SIGKILLed `replace` never undoes anything: it is played here by skipping the undo (the process is
    gone, the state says what it made).  The next `replace` terminates that instance before it launches."""
    from clustertool.core import state
    from clustertool.providers.aws import relaunch

    name = unique("rx")
    assert aws.ct(*UP, "--name", name)[0] == 0
    aws.faults.add("describe_instance_status", KeyboardInterrupt())
    with monkeypatch.context() as killed:
        killed.setattr(relaunch, "_undo", lambda *args, **kwargs: [])
        assert aws.ct("replace", "node-2", "--yes", "-c", name)[0] != 0
    left = state.load(name).provider_state["replacing"]["new"]
    assert _state(aws, left) == "running" and aws.leaks(name)["instances"] == 4
    code, _, err = aws.ct("replace", "node-2", "--yes", "-c", name)
    assert code == 0, err
    assert f"removing {left}, left by a `replace node-2` that did not finish" in err
    assert _state(aws, left) == "terminated" and aws.leaks(name)["instances"] == 3
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0
