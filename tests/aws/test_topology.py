"""Ranks in topology order on AWS: moto behind the EC2 stand-in (tests/aws/ec2front.py), which
answers DescribeInstanceTopology (moto lacks it) with a recorded-style answer replayed onto the
instances the test launches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws

# DescribeInstanceTopology's answer for 8 p5.48xlarge, as EC2 words it (three layers of network
# nodes, outermost first), in launch order: two racks' network nodes, interleaved by the launch
SPINE, AGG = "nn-1d4e1a2b3c4d5e6f7", "nn-2b7c6d5e4f3a2b1c0"
RECORDED = [[SPINE, AGG, "nn-3a1b2c3d4e5f6a7b8" if k in (0, 2, 3, 6) else "nn-3f9e8d7c6b5a49382"]
            for k in range(8)]


def _hosts(path: str) -> list[str]:
    return [line.split()[0] for line in Path(path).read_text().splitlines() if line.strip() and
            not line.startswith("#")]


def _by_ip(aws, name: str) -> dict[str, dict]:
    return {i["PrivateIpAddress"]: i for i in aws.instances(name)}


def test_eight_nodes_under_two_network_nodes_get_adjacent_ranks_leader_first_and_down_leaves_nothing(aws, ec2front):
    name = unique("topo")
    ec2front.topology_by_launch(RECORDED)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "8", "--instance-type", "p5.48xlarge", "--name", name, "--no-ssh")
    assert code == 0, err
    code, out, err = aws.ct("status", "-c", name, "--json", "--no-check")
    assert code == 0, err
    shown = json.loads(out)
    by_ip = _by_ip(aws, name)
    hosts = _hosts(shown["hostfile"])
    leaves = [ec2front.topology[by_ip[h]["InstanceId"]]["NetworkNodes"][-1] for h in hosts]
    assert leaves == [leaves[0]] * 4 + [leaves[-1]] * 4 and leaves[0] != leaves[-1]  # adjacent, 4 and 4
    tags = [{t["Key"]: t["Value"] for t in by_ip[h]["Tags"]} for h in hosts]
    assert tags[0]["clustertool:role"] == "leader" and tags[0]["Name"] == f"{name}-leader"
    assert [t["Name"] for t in tags[1:]] == [f"{name}-node-{k}" for k in range(2, 9)]  # names follow the order
    assert [t["clustertool:node"] for t in tags] == [str(k) for k in range(1, 9)]
    assert [g["nodes"] for g in shown["topology_groups"]] == [[f"node-{k}" for k in range(1, 5)],
                                                             [f"node-{k}" for k in range(5, 9)]]
    assert shown["topology_groups"][0]["path"] == RECORDED[0]
    assert shown["topology"].startswith(f"2 network node(s): {RECORDED[0][-1]}: node-1, node-2, node-3, node-4;")
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_no_topology_order_keeps_launch_order_and_a_refused_call_changes_nothing(aws, ec2front):
    name = unique("keep")
    ec2front.topology_by_launch(RECORDED[:4])
    code, _, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", "p5.48xlarge", "--name", name, "--no-ssh",
                          "--no-topology-order")
    assert code == 0, err
    shown = json.loads(aws.ct("status", "-c", name, "--json", "--no-check")[1])
    by_ip = _by_ip(aws, name)
    launch = sorted(by_ip.values(), key=lambda i: i["AmiLaunchIndex"])
    assert [by_ip[h]["InstanceId"] for h in _hosts(shown["hostfile"])] == [i["InstanceId"] for i in launch]
    assert "launch order" in shown["topology"] and len(shown["topology_groups"]) == 3  # a, b, a: not regrouped
    assert aws.ct("down", "-c", name, "--yes")[0] == 0

    other = unique("deny")
    ec2front.fail("DescribeInstanceTopology", "UnauthorizedOperation")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p5.48xlarge", "--name", other, "--no-ssh")
    assert code == 0, err
    assert "DescribeInstanceTopology" in ec2front.calls and "topology" not in err
    shown = json.loads(aws.ct("status", "-c", other, "--json", "--no-check")[1])
    assert shown["topology_groups"] == [] and "topology" not in shown
    assert aws.ct("down", "-c", other, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0 and aws.total_leaks(other) == 0
