"""The recovery controller's policy on AWS as data: every statement's actions, resources and conditions for a
cluster, what --keep-old, an Elastic IP and spot add, and what is never in it (no IAM action, no write without
the cluster's id or a named part of the cluster).  What `replace` really calls is checked against the same
document in tests/aws/test_controller_iam.py."""

from __future__ import annotations

import pytest

from clustertool.providers.aws import controller_policy
from clustertool.providers.aws.controller_policy import Scope

pytestmark = pytest.mark.unit
ID = "train-3f9a1c"
ARN = "arn:aws:ec2:us-west-2:111122223333"
OWN = {"StringEquals": {"aws:ResourceTag/clustertool:id": ID}}


def _scope(**extra) -> Scope:
    return Scope(ID, "us-west-2", "111122223333", subnets=("subnet-1",), security_groups=("sg-a", "sg-b"),
                 key_pairs=("clustertool-train",), placement_groups=("clustertool-train-pg",),
                 images=("ami-0abc",), **extra)


def _by_sid(document: dict) -> dict[str, dict]:
    return {s["Sid"]: s for s in document["Statement"]}


def test_a_plain_cluster_gets_exactly_these_statements():
    document = controller_policy.policy_document(_scope())
    assert document["Version"] == "2012-10-17"
    assert document["Statement"] == [
        {"Sid": "ReadAnywhereInTheRegion", "Effect": "Allow",
         "Action": ["ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypes", "ec2:DescribeInstances",
                    "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets"],
         "Resource": ["*"], "Condition": {"StringEquals": {"aws:RequestedRegion": "us-west-2"}}},
        {"Sid": "ReadOwnInstances", "Effect": "Allow", "Action": ["ec2:DescribeInstanceAttribute",
                                                                  "ec2:GetConsoleOutput"],
         "Resource": [f"{ARN}:instance/*"], "Condition": OWN},
        {"Sid": "LaunchOnlyTaggedAsTheCluster", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [f"{ARN}:instance/*", f"{ARN}:volume/*", f"{ARN}:network-interface/*"],
         "Condition": {"StringEquals": {"aws:RequestTag/clustertool:id": ID}}},
        {"Sid": "LaunchWithTheClustersParts", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [f"{ARN}:subnet/subnet-1", f"{ARN}:security-group/sg-a", f"{ARN}:security-group/sg-b",
                      f"{ARN}:key-pair/clustertool-train", f"{ARN}:placement-group/clustertool-train-pg",
                      "arn:aws:ec2:us-west-2::image/ami-0abc"]},
        {"Sid": "TagOnlyWhileLaunching", "Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": [f"{ARN}:instance/*", f"{ARN}:volume/*", f"{ARN}:network-interface/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances", "aws:RequestTag/clustertool:id": ID}}},
        {"Sid": "RemoveOwnInstances", "Effect": "Allow", "Action": ["ec2:TerminateInstances"],
         "Resource": [f"{ARN}:instance/*"], "Condition": OWN},
    ]


def test_keep_old_adds_stopping_and_only_the_replaced_tags_on_the_cluster_s_own_instances():
    sids = _by_sid(controller_policy.policy_document(_scope(keep_old=True)))
    assert sids["KeepTheOldInstanceStopped"] == {"Sid": "KeepTheOldInstanceStopped", "Effect": "Allow",
                                                 "Action": ["ec2:StopInstances"], "Resource": [f"{ARN}:instance/*"],
                                                 "Condition": OWN}
    tagging = sids["MarkTheOldInstanceReplaced"]
    assert tagging["Action"] == ["ec2:CreateTags"] and tagging["Resource"] == [f"{ARN}:instance/*"]
    assert tagging["Condition"] == {**OWN, "ForAllValues:StringEquals": {
        "aws:TagKeys": ["clustertool:replaced-by", "clustertool:role", "Name"]}}  # never clustertool:id
    plain = controller_policy.actions(controller_policy.policy_document(_scope()))
    assert "ec2:StopInstances" not in plain


def test_the_leader_s_elastic_ip_moves_only_onto_the_cluster_s_own_interfaces_and_instances():
    sids = _by_sid(controller_policy.policy_document(_scope(addresses=("eipalloc-1",))))
    assert sids["MoveTheLeadersAddress"] == {
        "Sid": "MoveTheLeadersAddress", "Effect": "Allow", "Action": ["ec2:AssociateAddress"],
        "Resource": [f"{ARN}:elastic-ip/eipalloc-1", f"{ARN}:network-interface/*", f"{ARN}:instance/*"],
        "Condition": OWN}
    assert "MoveTheLeadersAddress" not in _by_sid(controller_policy.policy_document(_scope()))


def test_spot_and_a_capacity_reservation_add_their_own_launch_parts():
    parts = _by_sid(controller_policy.policy_document(_scope(spot=True, capacity_reservations=("cr-9",))))[
        "LaunchWithTheClustersParts"]["Resource"]
    assert parts[-2:] == [f"{ARN}:capacity-reservation/cr-9", f"{ARN}:spot-instances-request/*"]


@pytest.mark.parametrize("extra", [{}, {"keep_old": True, "addresses": ("eipalloc-1",), "spot": True}])
def test_no_iam_action_no_wildcard_action_and_every_write_is_held_to_the_cluster(extra):
    document = controller_policy.policy_document(_scope(**extra))
    assert not [a for a in controller_policy.actions(document) if a.startswith("iam:") or "*" in a]
    for statement in document["Statement"]:
        writes = [a for a in statement["Action"] if not a.startswith(("ec2:Describe", "ec2:GetConsoleOutput"))]
        condition = statement.get("Condition", {}).get("StringEquals", {})
        if writes and statement["Sid"] != "LaunchWithTheClustersParts":
            assert ID in (condition.get("aws:ResourceTag/clustertool:id"),
                          condition.get("aws:RequestTag/clustertool:id")), statement
        if statement["Sid"] == "LaunchWithTheClustersParts":  # named parts, or the untagged spot request
            assert all(not r.endswith("/*") or ":spot-instances-request/" in r for r in statement["Resource"])
        if statement["Resource"] == ["*"]:
            assert all(a.startswith("ec2:Describe") for a in statement["Action"])
            assert condition == {"aws:RequestedRegion": "us-west-2"}


def test_only_ec2_may_take_the_role():
    assert controller_policy.trust_policy() == {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def test_names_are_fixed_by_the_cluster_id_and_fit_iam_s_limit():
    assert controller_policy.names(ID).role == "clustertool-ctl-train-3f9a1c" == controller_policy.names(ID).profile
    long_id = "a-very-long-cluster-name-that-someone-typed-for-a-run-" + "x" * 20 + "-3f9a1c"
    made = controller_policy.names(long_id)
    assert len(made.role) == 64 and made == controller_policy.names(long_id)
    assert made != controller_policy.names(long_id.replace("3f9a1c", "000000"))


def test_a_cluster_without_an_id_or_its_parts_gets_no_policy():
    with pytest.raises(ValueError):
        controller_policy.policy_document(Scope("", "us-west-2", "1"))
    with pytest.raises(ValueError):
        controller_policy.policy_document(Scope(ID, "us-west-2", "1", images=("ami-0",)))


@pytest.mark.parametrize("arn, mine", [
    (f"arn:aws:sts::111122223333:assumed-role/clustertool-ctl-{ID}/i-0abc", True),
    (f"arn:aws:sts::111122223333:assumed-role/clustertool-ctl-{ID}", True),  # owner.principal's form
    (f"arn:aws-cn:sts::111122223333:assumed-role/clustertool-ctl-{ID}/i-0abc", True),
    ("arn:aws:sts::111122223333:assumed-role/clustertool-ctl-train-000000/i-0abc", False),  # another cluster's
    ("arn:aws:sts::111122223333:assumed-role/admin/i-0abc", False),
    (f"arn:aws:iam::111122223333:role/clustertool/clustertool-ctl-{ID}", False),  # the role itself, not a session
    ("arn:aws:iam::111122223333:user/alice", False), ("", False)])
def test_only_a_session_of_this_cluster_s_own_role_is_its_controller(arn, mine):
    assert controller_policy.is_controller_of(arn, ID) is mine
    assert controller_policy.is_controller_of(arn, "") is False
