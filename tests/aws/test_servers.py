"""Reduction servers on AWS against a moto server: same AZ, subnet, security group and placement
group as the GPU nodes, tagged role server, priced, and nothing left after down or a failed up."""

from __future__ import annotations

import json

import pytest

from tests.aws.fakes import client_error
from tests.conftest import unique

pytestmark = pytest.mark.aws


def _tags(inst: dict) -> dict:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def _runs(aws) -> list[dict]:
    seen = []

    def grab(service, op, kwargs, call):
        if op == "run_instances" and not kwargs.get("DryRun"):
            seen.append(kwargs)
        return call()
    from clustertool.providers.aws import client

    client.HOOKS.insert(0, grab)
    return seen


def test_servers_land_with_the_nodes_in_one_az_and_placement_group_priced_and_down_removes_them(aws, tmp_path):
    name = unique("srv")
    runs = _runs(aws)
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                            "--no-ssh", "--reduction-servers", "2")
    assert code == 0, err
    instances = aws.instances(name)
    assert len(instances) == 4
    servers = [i for i in instances if _tags(i)["clustertool:role"] == "server"]
    gpus = [i for i in instances if _tags(i)["clustertool:role"] != "server"]
    assert {i["InstanceType"] for i in servers} == {"c6in.8xlarge"} and len(gpus) == 2
    assert sorted(_tags(i)["Name"] for i in servers) == [f"{name}-server-1", f"{name}-server-2"]
    assert len({i["Placement"]["AvailabilityZone"] for i in instances}) == 1
    assert len({i["SubnetId"] for i in instances}) == 1
    assert len(runs) == 2 and runs[0]["NetworkInterfaces"][0]["Groups"] == runs[1]["NetworkInterfaces"][0]["Groups"]
    assert runs[0]["NetworkInterfaces"][0]["SubnetId"] == runs[1]["NetworkInterfaces"][0]["SubnetId"]
    assert len(runs) == 2 and runs[1]["InstanceType"] == "c6in.8xlarge" and runs[1]["MinCount"] == 2
    assert runs[0]["Placement"] == runs[1]["Placement"] and runs[0]["Placement"].get("GroupName")
    assert len(aws.pgs.tagged(name)) == 1
    # priced: 2 x p4d + 2 x c6in.8xlarge
    assert "2 x c6in.8xlarge (servers)" in err and "2 x c6in.8xlarge at $1.8144/h" in err
    # servers are not ranks: the hostfile has the two GPU nodes
    lines = [ln for ln in (tmp_path / "hostfiles" / name).read_text().splitlines() if ln and not ln.startswith("#")]
    assert [ln.split()[0] for ln in lines] == sorted((i["PrivateIpAddress"] for i in gpus),
                                                     key=lambda a: a != _leader_address(gpus))
    code, out, err = aws.ct("status", "-c", name, "--json")
    status = json.loads(out)
    roles = sorted((n["node"], n["role"]) for n in status["nodes"])
    assert roles == [("node-1", "leader"), ("node-2", "member"), ("server-1", "server"), ("server-2", "server")]
    assert "$69.17/h" in json.dumps(status)  # 2 x 32.7726 + 2 x 1.8144
    code, out, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert "c6in.8xlarge" in out + err
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def _leader_address(gpus):
    return next(i["PrivateIpAddress"] for i in gpus if _tags(i)["clustertool:role"] == "leader")


def test_dry_run_plan_shows_the_servers_type_and_price(aws):
    code, out, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", "p4d.24xlarge", "--name", "plan",
                            "--reduction-servers", "4", "--dry-run")
    assert code == 0, err
    assert "reduction servers: 4 x c6in.8xlarge (32 vCPUs, no GPUs) in the same zone" in out
    assert "4 x c6in.8xlarge at $1.8144/h" in out and "$138.35/h" in out
    assert aws.total_leaks("plan") == 0


def _servers_capacity_in(*zones: str):
    def exc(kwargs):
        if kwargs.get("InstanceType") == "c6in.8xlarge" and not kwargs.get("DryRun") \
                and kwargs.get("Placement", {}).get("AvailabilityZone") in zones:
            return client_error("InsufficientInstanceCapacity", "RunInstances", "no c6in capacity")
        return None
    return exc


def test_no_server_capacity_in_a_zone_retreats_from_the_whole_attempt(aws):
    name = unique("srvcap")
    aws.faults.add("run_instances", _servers_capacity_in("us-east-1a"), times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--reduction-servers", "1")
    assert code == 0, err
    assert "us-east-1a: InsufficientInstanceCapacity" in err
    instances = aws.instances(name)
    assert len(instances) == 3 and {i["Placement"]["AvailabilityZone"] for i in instances} == {"us-east-1b"}
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_a_failed_server_launch_everywhere_leaves_nothing_of_the_gpu_nodes_either(aws):
    name = unique("srvx")
    aws.faults.add("run_instances", _servers_capacity_in("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d",
                                                         "us-east-1e", "us-east-1f"), times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--reduction-servers", "2")
    assert code != 0 and "Traceback" not in err
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_a_non_capacity_error_on_the_servers_rolls_everything_back(aws):
    name = unique("srvr")

    def boom(kwargs):
        if kwargs.get("InstanceType") == "c6in.8xlarge" and not kwargs.get("DryRun"):
            return client_error("UnauthorizedOperation", "RunInstances", "not allowed to launch c6in")
        return None
    aws.faults.add("run_instances", boom, times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--reduction-servers", "1")
    assert code != 0 and "UnauthorizedOperation" in err
    assert aws.total_leaks(name) == 0, aws.leaks(name)


def test_server_type_without_servers_and_servers_with_adoption_are_one_line_errors(aws):
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", "x",
                          "--server-type", "c5n.9xlarge", "--dry-run")
    assert code == 2 and "--server-type goes with --reduction-servers" in err


def test_sweep_counts_and_removes_a_lost_clusters_servers(aws):
    from clustertool.core import state

    name = unique("srvsw")
    assert aws.ct("up", "-p", "aws", "-N", "1", "--instance-type", "g4dn.12xlarge", "--name", name, "--no-ssh",
                  "--reduction-servers", "2")[0] == 0
    state.state_path(name).unlink()  # this machine no longer knows it
    code, out, err = aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 0, err
    found = [c for c in json.loads(out)["orphans"] if c["name"] == name]
    assert found and len(found[0]["resources"]["instance"]) == 3, out  # its GPU node and both servers are counted
    assert aws.total_leaks(name) == 0, aws.leaks(name)
