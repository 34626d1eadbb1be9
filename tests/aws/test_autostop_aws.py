"""Autostop / autodown against a moto server: the launch carries the shutdown behaviour the leader's
watcher relies on (an OS power-off stops or terminates the instance, no credentials on the nodes),
and the next command that sees a cluster its watcher powered off shows it and removes what is left.

The watcher cannot run here (moto's instances answer no SSH, so these clusters are brought up with
--no-ssh): its power-off is simulated by stopping / terminating the instances through the API, as
EC2 does when an instance's OS shuts down with that behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws


def _behaviour(aws, instance_id: str) -> str:
    attr = aws.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
    return attr["InstanceInitiatedShutdownBehavior"]["Value"]


def _events(name: str) -> list[str]:
    import os

    path = Path(os.environ["CLUSTERTOOL_HOME"]) / "ledger.jsonl"
    return [e["event"] for e in map(json.loads, path.read_text().splitlines()) if e["name"] == name]


def test_dry_run_plan_shows_autostop_and_terminate_on_shutdown(aws):
    name = unique("pl")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name,
                            "--autostop", "30m", "--autodown", "--dry-run")
    assert code == 0, err
    assert "autostop: terminate (autodown) every node after 30m idle" in out
    assert "InstanceInitiatedShutdownBehavior=terminate" in out
    assert aws.total_leaks(name) == 0


def test_autodown_launches_terminate_on_shutdown_and_down_after_the_power_off_leaves_nothing(aws):
    name = unique("ad")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "3", "--instance-type", "g5.xlarge", "--name", name,
                          "--no-ssh", "--autostop", "30m", "--autodown")
    assert code == 0, err
    instances = aws.instances(name)
    assert len(instances) == 3
    assert {_behaviour(aws, i["InstanceId"]) for i in instances} == {"terminate"}

    aws.ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in instances])  # the watcher's power-off
    code, out, err = aws.ct("ls", "--json")
    assert code == 0, err
    assert [c["status"] for c in json.loads(out) if c["name"] == name] == ["autodowned"]
    left = aws.leaks(name)
    assert left["security_groups"] == left["key_pairs"] == left["placement_groups"] == left["addresses"] == 0, left

    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert _events(name) == ["up", "autodown"]


def test_autostop_launches_stop_on_shutdown_and_status_shows_the_cluster_autostopped(aws):
    name = unique("as")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--autostop", "45m")
    assert code == 0, err
    instances = aws.instances(name)
    assert {_behaviour(aws, i["InstanceId"]) for i in instances} == {"stop"}

    aws.ec2.stop_instances(InstanceIds=[i["InstanceId"] for i in instances])
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0, err
    assert "autostopped" in out and "stop every node after 45m idle" in out
    kept = aws.leaks(name)  # stopped, not gone: everything is kept for `start`
    assert kept["security_groups"] == 2 and kept["addresses"] == 1, kept  # the cluster's and the leader's; its EIP

    code, out, err = aws.ct("cost", "--json")
    assert code == 0, err
    row = next(c for c in json.loads(out)["clusters"] if c["name"] == name)
    assert (row["state"], row["nodes"], row["type"]) == ("autostopped", 2, "p4d.24xlarge")
    assert row["hourly_usd"] == pytest.approx(2 * 32.7726, abs=0.01)

    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert _events(name) == ["up", "autostop", "down"]


def test_autostop_without_autodown_is_refused_for_one_time_spot(aws):
    name = unique("sp")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name,
                            "--no-ssh", "--spot", "--autostop", "30m")
    assert code != 0
    assert "cannot be stopped" in err and "--autodown" in err
    assert aws.instances(name) == []


def test_a_sweep_notices_an_autodowned_cluster_and_removes_its_leftovers(aws):
    name = unique("sw")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", name,
                          "--no-ssh", "--autostop", "10m", "--autodown")
    assert code == 0, err
    aws.ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in aws.instances(name)])
    code, out, err = aws.ct("down", "--sweep", "--region", "us-east-1", "--yes")
    assert code == 0, err
    assert f"{name}: the cluster's watcher terminated it" in err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0, err
    assert "autodowned" in out
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
