"""The recovery controller's identity on AWS, against the moto server: a role only EC2 may take, its inline
policy (the very document controller_policy.py builds for this cluster's subnet, groups, key, image and
Elastic IP), an instance profile holding it, associated with the chosen node; `down` and `down --sweep`
remove all of it; a failure half way removes what was made; every AWS call `replace` makes is an action
the policy allows.  (The policy's statements as data: tests/unit/test_controller_policy.py; signals after
every one of these calls: tests/aws/test_fault_matrix.py.)

moto checks no IAM policy, so what the policy *denies* is not proven here: the statements are checked as
data, and the actions against what `replace` really calls."""

from __future__ import annotations

import json
import re

import pytest

from tests.aws import iamworld
from tests.aws.fakes import client_error
from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "3", "--instance-type", "p4d.24xlarge", "--no-ssh")


def _up(aws, prefix: str) -> str:
    name = unique(prefix)
    code, _, err = aws.ct(*UP, "--name", name)
    assert code == 0, err
    return name


def _session(name: str):
    from clustertool.cluster.session import ClusterSession

    return ClusterSession.load(name)


def _make(name: str, node: str = "leader", keep_old: bool = False) -> list[str]:
    session = _session(name)
    return session.provider.controller_identity(session.record, node, keep_old=keep_old, save=session.save)


def _leader(aws, name: str) -> dict:
    return next(i for i in aws.instances(name)
                if {t["Key"]: t["Value"] for t in i["Tags"]}["clustertool:role"] == "leader")


def test_the_role_policy_and_profile_are_made_tagged_associated_with_the_leader_shown_and_down_removes_them(aws):
    from clustertool.core import state
    from clustertool.providers.aws import controller_iam, controller_policy
    from clustertool.providers.aws.client import Aws

    name = _up(aws, "ci")
    lines = _make(name)
    record = state.load(name)
    names = controller_policy.names(record.id)
    assert lines == [f"made the controller's role {names.role} (policy clustertool-replace: replace this cluster's "
                     f"nodes only) in instance profile {names.profile}, on node-1 ({record.leader.instance_id})"]
    iam, ec2 = iamworld.clients(aws.url)
    role = iam.get_role(RoleName=names.role)["Role"]
    assert role["Path"] == "/clustertool/"
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                   "Action": "sts:AssumeRole"}]
    role_tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=names.role)["Tags"]}
    assert (role_tags["clustertool:cluster"], role_tags["clustertool:id"]) == (name, record.id)
    assert role_tags["clustertool:role"] == "controller" and "clustertool:lease" not in role_tags
    # the inline policy is exactly the document for this cluster as it is (no managed policy to leak)
    assert iam.list_attached_role_policies(RoleName=names.role)["AttachedPolicies"] == []
    assert iam.list_role_policies(RoleName=names.role)["PolicyNames"] == ["clustertool-replace"]
    stored = iam.get_role_policy(RoleName=names.role, PolicyName="clustertool-replace")["PolicyDocument"]
    stored = json.loads(stored) if isinstance(stored, str) else stored
    scope = controller_iam.scope_for(Aws(region="us-east-1"), record)
    assert stored == controller_policy.policy_document(scope)
    leader = _leader(aws, name)
    assert scope.subnets == (leader["SubnetId"],) and scope.images == (leader["ImageId"],)
    assert len(scope.security_groups) == 2 and len(scope.addresses) == 1  # the cluster's and the leader's; its EIP
    profile = iam.get_instance_profile(InstanceProfileName=names.profile)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [names.role] and profile["Path"] == "/clustertool/"
    (assoc,) = iamworld.associations(aws.url, name)
    assert assoc["InstanceId"] == leader["InstanceId"] and assoc["IamInstanceProfile"]["Arn"] == profile["Arn"]
    assert record.provider_state["controller_identity"]["association"] == assoc["AssociationId"]

    code, out, err = aws.ct("status", "-c", name, "--no-check", "--json")
    assert code == 0, err
    assert json.loads(out)["controller identity"].startswith(f"role {names.role} in instance profile "
                                                             f"{names.profile} on node-1 ({leader['InstanceId']})")
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"removed the controller's instance profile {names.profile} and role {names.role}" in err
    assert iamworld.leaks(aws.url, name) == 0 and aws.total_leaks(name) == 0


def test_a_failure_half_way_removes_what_was_made_and_leaves_the_state_without_it(aws):
    from clustertool.core import state
    from clustertool.core.errors import ToolError

    name = _up(aws, "cf")
    aws.faults.add("associate_iam_instance_profile", client_error("UnauthorizedOperation", "Associate", "no"))
    with pytest.raises(ToolError) as exc:
        _make(name)
    assert "associating the instance profile" in exc.value.message and "UnauthorizedOperation" in exc.value.message
    assert iamworld.leaks(aws.url, name) == 0
    assert "controller_identity" not in state.load(name).provider_state
    assert aws.recorder.ops[-5:] == ["get_instance_profile", "remove_role_from_instance_profile",
                                     "delete_instance_profile", "delete_role_policy", "delete_role"]
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def test_ctrl_c_after_the_role_is_made_removes_it(aws):
    from clustertool.core import state

    name = _up(aws, "cc")
    aws.faults.add("put_role_policy", KeyboardInterrupt(), after=True)
    with pytest.raises(KeyboardInterrupt):
        _make(name)
    assert iamworld.leaks(aws.url, name) == 0 and "controller_identity" not in state.load(name).provider_state
    assert aws.ct("down", "-c", name, "--yes")[0] == 0


def test_the_association_is_retried_while_ec2_does_not_see_the_new_profile_yet(aws):
    name = _up(aws, "cr")
    aws.faults.add("associate_iam_instance_profile",
                   client_error("InvalidParameterValue", "Associate", "Value (x) for parameter iamInstanceProfile.name "
                                                                      "is invalid. Invalid IAM Instance Profile name"),
                   times=2)
    _make(name, "node-2")
    assert aws.faults.fired == ["associate_iam_instance_profile"] * 2
    (assoc,) = iamworld.associations(aws.url, name)
    assert assoc["InstanceId"] == _session(name).record.node("node-2").instance_id
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and iamworld.leaks(aws.url, name) == 0


def test_a_node_that_has_a_profile_of_its_own_is_refused_before_anything_is_made(aws):
    from clustertool.core.errors import UsageError

    name = _up(aws, "cn")
    iam, ec2 = iamworld.clients(aws.url)
    iam.create_role(RoleName=f"{name}-theirs", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=f"{name}-theirs")
    iam.add_role_to_instance_profile(InstanceProfileName=f"{name}-theirs", RoleName=f"{name}-theirs")
    ec2.associate_iam_instance_profile(IamInstanceProfile={"Name": f"{name}-theirs"},
                                       InstanceId=_leader(aws, name)["InstanceId"])
    with pytest.raises(UsageError) as exc:
        _make(name)
    assert "already has an instance profile" in exc.value.message and exc.value.hint
    assert iamworld.leaks(aws.url, name) == 0
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    for assoc in ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]:
        ec2.disassociate_iam_instance_profile(AssociationId=assoc["AssociationId"])
    iam.remove_role_from_instance_profile(InstanceProfileName=f"{name}-theirs", RoleName=f"{name}-theirs")
    iam.delete_instance_profile(InstanceProfileName=f"{name}-theirs")
    iam.delete_role(RoleName=f"{name}-theirs")


def test_a_lost_state_s_controller_identity_is_found_and_removed_by_down_sweep(aws):
    from clustertool.core import state

    name = _up(aws, "cs")
    _make(name, "node-3")
    record = state.load(name)
    state.state_path(name).unlink()  # the state is lost: only tags say what is the cluster's
    code, out, err = aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 0, err
    (found,) = [o for o in json.loads(out)["orphans"] if o["id"] == record.id]
    assert found["resources"]["iam-role"] == found["resources"]["iam-instance-profile"] == [
        f"clustertool-ctl-{record.id}"]
    assert found["action"] == "delete"
    assert iamworld.leaks(aws.url, name) == 0 and aws.total_leaks(name) == 0


def _camel(op: str) -> str:
    return "".join(word.title() for word in op.split("_"))


@pytest.mark.parametrize("args", [("node-2",), ("leader",), ("node-3", "--keep-old")])
def test_every_aws_call_replace_makes_is_an_action_the_controller_s_policy_allows(aws, monkeypatch, args):
    """`replace` as the controller would run it: each call it makes, as an IAM action, is in the policy made
    for this cluster (with --keep-old: the policy made for it); it makes no IAM call and no call of another
    service but sts:GetCallerIdentity, which IAM never denies."""
    from clustertool.core import state
    from clustertool.providers.aws import client, controller_iam, controller_policy
    from clustertool.providers.aws.client import Aws

    name = _up(aws, "ca")
    keep_old = "--keep-old" in args
    document = controller_policy.policy_document(controller_iam.scope_for(Aws(region="us-east-1"), state.load(name),
                                                                          keep_old))
    seen: list[tuple[str, str]] = []

    def grab(service, op, kwargs, call):
        seen.append((service, op))
        return call()
    monkeypatch.setattr(client, "HOOKS", [grab, *client.HOOKS])  # outermost: sees calls a stand-in answers too
    code, _, err = aws.ct("replace", *args, "--yes", "-c", name)
    assert code == 0, err
    called = {f"{service}:{_camel(op)}" for service, op in seen}
    assert {"ec2:RunInstances", "ec2:TerminateInstances" if not keep_old else "ec2:StopInstances"} <= called
    assert ("ec2:AssociateAddress" in called) == (args[0] == "leader")
    assert called - controller_policy.actions(document) == {"sts:GetCallerIdentity"}, called
    assert not [a for a in controller_policy.actions(document) if re.match(r"iam:", a)]
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and aws.total_leaks(name) == 0


def _as_role(aws, monkeypatch, role_arn: str) -> None:
    """This process's AWS calls from now on as ``role_arn`` (moto's STS hands out its credentials, as the instance
    metadata would on the controller's node)."""
    import boto3

    sts = boto3.client("sts", endpoint_url=aws.url, region_name="us-east-1")
    creds = sts.assume_role(RoleArn=role_arn, RoleSessionName="i-0controller")["Credentials"]
    for key, value in (("AWS_ACCESS_KEY_ID", creds["AccessKeyId"]), ("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"]),
                       ("AWS_SESSION_TOKEN", creds["SessionToken"])):
        monkeypatch.setenv(key, value)


def test_the_controller_s_role_replaces_a_node_of_its_cluster_and_another_role_is_refused_as_another_owner(
        aws, monkeypatch):
    """`replace` asks STS who calls and refuses another owner's cluster; the cluster's own controller (its
    role's session, as on the node holding the profile) acts for the owner.  moto checks no policy: what the
    role may call is tests/unit/test_controller_policy.py's and the test above's."""
    from clustertool.core import state

    name = _up(aws, "co")
    _make(name)
    iam, _ = iamworld.clients(aws.url)
    role = iam.get_role(RoleName=f"clustertool-ctl-{state.load(name).id}")["Role"]["Arn"]
    other = iam.create_role(RoleName=f"{name}-other", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    _as_role(aws, monkeypatch, other)
    code, _, err = aws.ct("replace", "node-2", "--yes", "-c", name)
    assert code != 0 and "belongs to" in err and "--force-owner" in err
    _as_role(aws, monkeypatch, role)
    code, out, err = aws.ct("replace", "node-2", "--yes", "-c", name)
    assert code == 0, err
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    iam.delete_role(RoleName=f"{name}-other")
    assert aws.ct("down", "-c", name, "--yes")[0] == 0 and iamworld.leaks(aws.url, name) == 0


def test_up_controller_node_makes_the_identity_records_it_status_shows_it_and_down_removes_it(aws):
    """`up --controller-node node-2`: the identity is made by `up` itself (inside its rollback) and recorded;
    --no-ssh (moto's instances run no sshd) leaves the controller process unstarted and says so."""
    from clustertool.core import state
    from clustertool.providers.aws import controller_policy

    name = unique("cu")
    code, _, err = aws.ct(*UP, "--name", name, "--controller-node", "node-2")
    assert code == 0, err
    record = state.load(name)
    names = controller_policy.names(record.id)
    node2 = record.node("node-2").instance_id
    assert f"made the controller's role {names.role}" in err and f"on node-2 ({node2})" in err
    assert "controller: not started (--no-ssh: it watches the jobs' leader over SSH)" in err
    assert record.options["controller"] == {"node": "node-2"}
    assert record.provider_state["controller_identity"]["node"] == "node-2"
    (assoc,) = iamworld.associations(aws.url, name)
    assert assoc["InstanceId"] == node2
    code, out, err = aws.ct("status", "-c", name, "--no-check", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["controller identity"].startswith(f"role {names.role} in instance profile {names.profile} on "
                                                   f"node-2 ({node2})")
    assert shown["controller"] == "not started (--no-ssh: it watches the jobs' leader over SSH)"
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"removed the controller's instance profile {names.profile} and role {names.role}" in err
    assert iamworld.leaks(aws.url, name) == 0 and aws.total_leaks(name) == 0


def test_up_controller_whose_identity_fails_rolls_everything_back(aws):
    from clustertool.core import state

    name = unique("cx")
    aws.faults.add("associate_iam_instance_profile", client_error("UnauthorizedOperation", "Associate", "no"))
    code, _, err = aws.ct(*UP, "--name", name, "--controller-node", "node-3")
    assert code != 0 and "UnauthorizedOperation" in err, err
    assert "removing what was made" in err
    assert not state.exists(name)
    assert iamworld.leaks(aws.url, name) == 0 and aws.total_leaks(name) == 0
