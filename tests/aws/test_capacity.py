"""All N in one AZ, or the next AZ: capacity errors are injected at the client seam (moto
never runs out of capacity), the rest is the moto server."""

from __future__ import annotations

import pytest

from tests.aws.fakes import client_error
from tests.conftest import unique

pytestmark = pytest.mark.aws


def _capacity_in(*zones: str, code: str = "InsufficientInstanceCapacity"):
    def exc(kwargs):
        if kwargs.get("Placement", {}).get("AvailabilityZone") in zones and not kwargs.get("DryRun"):
            return client_error(code, "RunInstances", "We currently do not have sufficient capacity")
        return None
    return exc


def test_capacity_failure_in_first_az_then_success_in_second_leaves_nothing_of_the_first(aws):
    name = unique("cap")
    aws.faults.add("run_instances", _capacity_in("us-east-1a"), times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", "p4d.24xlarge", "--name", name, "--no-ssh")
    assert code == 0, err
    assert "us-east-1a: InsufficientInstanceCapacity" in err
    zones = {i["Placement"]["AvailabilityZone"] for i in aws.instances(name)}
    assert zones == {"us-east-1b"} and len(aws.instances(name)) == 4
    assert [g for g in aws.pgs.created if "us-east-1a" in g] and not [g for g in aws.pgs.groups if "us-east-1a" in g]
    assert [g for g in aws.pgs.groups] == [g for g in aws.pgs.created if "us-east-1b" in g]
    from clustertool.core import state

    assert not [g for g in state.load(name).provider_state["placement_groups"] if "us-east-1a" in g]
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_every_az_failing_names_each_zone_and_why_and_leaves_nothing(aws):
    name = unique("capx")
    aws.faults.add("run_instances", _capacity_in("us-east-1a", "us-east-1c", "us-east-1d"), times=99)
    aws.faults.add("run_instances", _capacity_in("us-east-1b", code="InstanceLimitExceeded"), times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", "p4d.24xlarge", "--name", name, "--no-ssh")
    assert code != 0
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in err
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"):
        assert zone in error[0]
    assert "us-east-1b: InstanceLimitExceeded" in error[0]
    assert "hint:" in err
    assert aws.total_leaks(name) == 0 and len(aws.pgs.created) == 4


def test_az_flag_tries_only_that_zone(aws):
    name = unique("onez")
    aws.faults.add("run_instances", _capacity_in("us-east-1c"), times=99)
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", name,
                          "--no-ssh", "--az", "us-east-1c")
    assert code != 0 and "us-east-1c: InsufficientInstanceCapacity" in err
    assert "us-east-1a" not in err.split("error:")[1]
    assert aws.total_leaks(name) == 0
