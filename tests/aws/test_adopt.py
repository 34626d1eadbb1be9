"""Adopt instances launched by hand. The hand launch is done with boto3 in the test: it stands
in for the user's console and is not the tool under test; everything after is the tool."""

from __future__ import annotations

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
BEATLES = ["john", "paul", "george", "ringo"]


def _launch_by_hand(aws, names: list[str], itype: str = "g5.12xlarge") -> dict[str, str]:
    image = aws.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = {}
    for name in names:
        inst = aws.ec2.run_instances(ImageId=image, InstanceType=itype, MinCount=1, MaxCount=1,
                                     Placement={"AvailabilityZone": "us-east-1a"},
                                     TagSpecifications=[{"ResourceType": "instance",
                                                         "Tags": [{"Key": "Name", "Value": name}]}])
        ids[name] = inst["Instances"][0]["InstanceId"]
    return ids


def _states(aws, ids) -> set[str]:
    found = aws.ec2.describe_instances(InstanceIds=list(ids))["Reservations"]
    return {i["State"]["Name"] for r in found for i in r["Instances"]}


def test_adopt_by_tag_names_the_leader_and_down_never_terminates(aws, tmp_path):
    ids = _launch_by_hand(aws, BEATLES)
    name = unique("beatles")
    code, out, err = aws.ct("up", "-p", "aws", "--adopt-tag", "Name=" + ",".join(BEATLES), "--leader", "paul",
                            "--name", name, "--no-ssh")
    assert code == 0, err
    hostfile = [line for line in (tmp_path / "hostfiles" / name).read_text().splitlines() if "slots=" in line]
    private = {n: aws.ec2.describe_instances(InstanceIds=[i])["Reservations"][0]["Instances"][0]["PrivateIpAddress"]
               for n, i in ids.items()}
    assert hostfile[0] == f"{private['paul']} slots=4"  # g5.12xlarge has 4 GPUs; the leader first
    assert len(hostfile) == 4
    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert _states(aws, ids.values()) == {"running"}
    tags = aws.ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
    assert not any(t["Key"].startswith("clustertool:") for r in tags for i in r["Instances"] for t in i.get("Tags", []))


def test_adopt_by_ids_terminates_only_with_terminate_adopted(aws):
    ids = _launch_by_hand(aws, ["a1", "a2"])
    name = unique("ids")
    code, _, err = aws.ct("up", "-p", "aws", "--adopt-ids", ",".join(ids.values()), "--name", name, "--no-ssh")
    assert code == 0, err
    code, _, err = aws.ct("down", "-c", name, "--yes", "--terminate-adopted")
    assert code == 0, err
    assert _states(aws, ids.values()) == {"terminated"}


def test_adopt_errors_name_what_is_missing(aws):
    _launch_by_hand(aws, ["john"])
    code, _, err = aws.ct("up", "-p", "aws", "--adopt-tag", "Name=john,yoko", "--name", unique("miss"), "--no-ssh")
    assert code != 0 and "not found" in err and "yoko" in err and "Traceback" not in err
    code, _, err = aws.ct("up", "-p", "aws", "--adopt-tag", "john", "--name", unique("bad"), "--no-ssh")
    assert code != 0 and "KEY=VALUE" in err
    code, _, err = aws.ct("up", "-p", "aws", "--adopt-tag", "Name=john", "--leader", "paul", "--name",
                          unique("ldr"), "--no-ssh")
    assert code != 0 and "--leader 'paul'" in err
