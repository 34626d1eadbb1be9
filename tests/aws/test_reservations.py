"""`up --capacity-reservation` and `--reservations` against moto behind the EC2 stand-in
(tests/aws/ec2front.py: moto has no capacity reservations and ignores the launch's reservation
fields; the stand-in answers DescribeCapacityReservations and records every RunInstances)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
P5 = "p5.48xlarge"


def _in_days(days: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=days)


def _launches(front) -> list[dict]:
    return [r for r in front.runs if not r.get("DryRun")]


def _nothing_made(aws, front, name: str) -> None:
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert not [i for r in aws.ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert _launches(front) == []


def test_up_launches_into_the_odcr_in_its_zone_with_the_target_sent_shows_it_and_down_leaves_nothing(aws, ec2front):
    res = ec2front.add_reservation(P5, "us-east-1b", 4, end=_in_days(3))
    rid, name = res["CapacityReservationId"], unique("odcr")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", name, "--no-ssh",
                          "--capacity-reservation", rid)
    assert code == 0, err
    instances = aws.instances(name)
    assert {i["Placement"]["AvailabilityZone"] for i in instances} == {"us-east-1b"} and len(instances) == 2
    (run,) = _launches(ec2front)
    assert run["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": rid}}
    assert run["Placement"] == {"AvailabilityZone": "us-east-1b"}  # no placement group of ours
    assert aws.pgs.tagged(name) == []
    assert ec2front.reservation(rid)["AvailableInstanceCount"] == 2
    assert sorted(ec2front.held_by(rid)) == sorted(i["InstanceId"] for i in instances)
    assert "$0.00/h more" in err and f"capacity reservation {rid}" in err

    code, out, err = aws.ct("status", "-c", name, "--json", "--no-check")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["capacity reservation"].startswith(f"{rid} (4 x {P5} in us-east-1b; 4 were free at launch; ends ")
    assert shown["hourly price"].startswith("$0.00/h more") and shown["cost so far"].startswith("$0.00 more")

    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0 and f"giving 2 instance(s) back to capacity reservation {rid}" in err, err
    assert aws.total_leaks(name) == 0, aws.leaks(name)
    assert ec2front.reservation(rid)["AvailableInstanceCount"] == 4
    code, out, err = aws.ct("cost", "--json")
    (row,) = [c for c in json.loads(out)["clusters"] if c["name"] == name]
    assert row["hourly_usd"] == 0 and row["cost_usd"] == 0 and row["prepaid"] == f"capacity reservation {rid}"
    assert any("the reservation bills by itself" in note for note in row["notes"])


@pytest.mark.parametrize("seed, want", [
    ({"instance_type": "p4d.24xlarge"}, "it holds p4d.24xlarge, not p5.48xlarge"),
    ({"available": 1}, "it has 1 of 4 instance(s) free, fewer than --nodes 2"),
    ({"state": "cancelled"}, "it is cancelled, not active"),
    ({"end": "past"}, "it ended"),
    ({"platform": "Windows"}, "it is for Windows instances"),
])
def test_a_reservation_that_cannot_take_the_cluster_is_refused_in_one_line_before_anything_is_made(
        aws, ec2front, seed, want):
    kwargs = {"instance_type": P5, "az": "us-east-1b", "count": 4, **seed}
    if kwargs.get("end") == "past":
        kwargs["end"] = _in_days(-1)
    rid, name = ec2front.add_reservation(**kwargs)["CapacityReservationId"], unique("bad")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", name, "--no-ssh",
                          "--capacity-reservation", rid)
    assert code != 0
    assert want in err and f"--capacity-reservation {rid} cannot take 2 x {P5}" in err
    assert "Traceback" not in err
    _nothing_made(aws, ec2front, name)


def test_an_unknown_reservation_or_a_zone_that_is_not_its_own_is_refused_before_anything_is_made(aws, ec2front):
    name = unique("nores")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", name, "--no-ssh",
                          "--capacity-reservation", "cr-0123456789abcdef0")
    assert code != 0 and "no such capacity reservation in us-east-1" in err
    rid = ec2front.add_reservation(P5, "us-east-1b", 4)["CapacityReservationId"]
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", name, "--no-ssh",
                          "--capacity-reservation", rid, "--az", "us-east-1a")
    assert code != 0 and f"{rid} is in us-east-1b, not us-east-1a" in err
    _nothing_made(aws, ec2front, name)


def test_plan_shows_the_reservation_free_count_and_end_and_the_preferences_reach_the_request(aws, ec2front):
    end = _in_days(2)
    rid = ec2front.add_reservation(P5, "us-east-1c", 8, available=6, end=end)["CapacityReservationId"]
    code, out, err = aws.ct("up", "-p", "aws", "-N", "4", "--instance-type", P5, "--name", unique("plan"),
                            "--dry-run", "--capacity-reservation", rid)
    assert code == 0, err
    assert f"capacity reservation {rid}: 6 of 8 x {P5} free in us-east-1c, active, ends " \
           f"{end.strftime('%Y-%m-%d %H:%M')} UTC" in out
    assert "Availability Zones to try" not in out and "dry run: nothing was created" in out
    sent = {}
    for pref, value in (("only", "capacity-reservations-only"), ("none", "none")):
        code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", unique("pref"),
                                "--dry-run", "--reservations", pref)
        assert code == 0, err
        sent[value] = ec2front.runs[-1]["CapacityReservationSpecification"]["CapacityReservationPreference"]
    assert sent == {"capacity-reservations-only": "capacity-reservations-only", "none": "none"}
    group = "arn:aws:resource-groups:us-east-1:123456789012:group/p5-reservations"
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", unique("grp"),
                            "--dry-run", "--capacity-reservation-group", group)
    assert code == 0 and f"capacity reservation group {group}" in out, err
    assert ec2front.runs[-1]["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationResourceGroupArn": group}}
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", P5, "--name", unique("both"),
                          "--capacity-reservation", rid, "--spot")
    assert code != 0 and "do not go with --spot" in err
