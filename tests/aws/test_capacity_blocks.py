"""EC2 Capacity Blocks for ML: `capacity offerings|buy|ls` and `up --capacity-block [--wait]`.

moto implements none of the Capacity Block calls, so these tests run against the EC2 stand-in
(``tests/aws/ec2front.py``, the ``ec2front`` fixture): it answers DescribeCapacityBlockOfferings,
PurchaseCapacityBlock and DescribeCapacityReservations in the shapes of botocore's EC2 model,
checks RunInstances' reservation target and market the way EC2 does, records every RunInstances,
and forwards everything else to the moto server.  A block's state follows the clock there
(``scheduled`` before its start, ``active`` after), so a block a few seconds ahead really starts.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTC = dt.timezone.utc
P5 = "p5.48xlarge"


def _now() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0)


def _launches(front) -> list[dict]:
    return [r for r in front.runs if not r.get("DryRun")]


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
def no_tty(monkeypatch):
    """stdin is not a terminal (as in a script or CI): nothing can be asked."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


def _seed_offerings(front) -> tuple[dict, dict]:
    start = _now() + dt.timedelta(days=1)
    first = front.add_offering(P5, "us-east-1b", 4, start, 48, fee="30000.00")
    second = front.add_offering(P5, "us-east-1c", 4, start + dt.timedelta(days=1), 48, fee="28800.00")
    front.add_offering(P5, "us-east-1a", 4, start, 24, fee="15000.00")  # 1 day: not what is asked
    return first, second


def test_offerings_table_and_json_show_fee_per_instance_hour_and_per_cluster_hour(aws, ec2front):
    first, second = _seed_offerings(ec2front)
    code, out, err = aws.ct("capacity", "offerings", "--instance-type", P5, "--nodes", "4", "--days", "2")
    assert code == 0, err
    rows = {w: line for line in out.splitlines() for w in line.replace("│", " ").split() if w.startswith("cb-")}
    assert set(rows) == {first["CapacityBlockOfferingId"], second["CapacityBlockOfferingId"]}, out
    row = rows[first["CapacityBlockOfferingId"]]
    # 30000 / 48 h / 4 instances = 156.25 per instance-hour; 30000 / 48 h = 625 per cluster-hour
    assert "us-east-1b" in row and "$30,000.00" in row and "$156.25" in row and "$625.00" in row, row
    assert "per instance-hour = fee / hours / instances" in out
    code, out, err = aws.ct("capacity", "offerings", "--instance-type", P5, "--nodes", "4", "--days", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    by_id = {o["id"]: o for o in doc["offerings"]}
    assert by_id[second["CapacityBlockOfferingId"]]["per_node_hour"] == 150.0
    assert by_id[second["CapacityBlockOfferingId"]]["per_cluster_hour"] == 600.0
    assert by_id[first["CapacityBlockOfferingId"]]["hours"] == 48 and doc["query"]["days"] == 2
    assert ec2front.calls.count("DescribeCapacityBlockOfferings") == 2


def test_offerings_bad_input_is_one_line_before_any_call(aws, ec2front):
    code, _, err = aws.ct("capacity", "offerings", "--instance-type", P5, "--nodes", "4", "--days", "400")
    assert code == 2 and _errors(err) == ["error: --days: a Capacity Block lasts 1 to 182 days, got 400"], err
    code, _, err = aws.ct("capacity", "offerings", "--instance-type", P5, "--nodes", "4", "--days", "2",
                          "--start-after", "next week")
    assert code == 2 and _errors(err)[0].startswith("error: invalid --start-after 'next week'"), err
    assert "DescribeCapacityBlockOfferings" not in ec2front.calls


def test_buy_is_refused_without_yes_then_done_with_it_and_counted_in_the_ledger(aws, ec2front, no_tty):
    first, _ = _seed_offerings(ec2front)
    oid = first["CapacityBlockOfferingId"]
    assert aws.ct("capacity", "offerings", "--instance-type", P5, "--nodes", "4", "--days", "2")[0] == 0
    code, out, err = aws.ct("capacity", "buy", oid)
    assert code == 2 and "Traceback" not in err
    assert _errors(err) == [err.splitlines()[0]] and "without --yes" in err and "nothing was bought" in err, err
    assert "$30,000.00" not in out and "30,000.00 USD upfront" in err  # the fee, from EC2's fresh answer
    assert "PurchaseCapacityBlock" not in ec2front.calls and not ec2front.reservations
    from clustertool.cluster import ledger

    assert not [e for e in ledger.read() if e["event"] == "purchase"]
    code, out, err = aws.ct("capacity", "buy", oid, "--yes")
    assert code == 0, err
    [rid] = list(ec2front.reservations)
    assert f"bought: {rid} (4 x {P5} in us-east-1b" in out and "$30,000.00 recorded in the cost ledger" in out
    assert f"--capacity-block {rid}" in out
    [spent] = [e for e in ledger.read() if e["event"] == "purchase"]
    assert spent["id"] == rid and spent["usd"] == 30000.0
    code, out, _ = aws.ct("cost", "--json")
    assert json.loads(out)["total_usd"] == 30000.0
    code, out, _ = aws.ct("capacity", "ls", "--json")
    [block] = json.loads(out)["reservations"]
    assert block["id"] == rid and block["type"] == "capacity-block" and block["state"] == "scheduled"
    assert block["time_left"].startswith("starts in 1d")
    code, out, _ = aws.ct("capacity", "ls")
    assert rid in out and "capacity block" in out and "scheduled" in out and "4/4" in out, out


def test_buy_of_an_offering_no_list_showed_is_refused_and_buys_nothing(aws, ec2front):
    code, _, err = aws.ct("capacity", "buy", "cb-0123456789abcdef0", "--yes")
    assert code == 2 and "is not in the last `capacity offerings` list" in _errors(err)[0], err
    assert "PurchaseCapacityBlock" not in ec2front.calls


UP = ("up", "-p", "aws", "-N", "2", "--no-ssh")


def test_up_before_the_block_starts_says_when_and_makes_nothing(aws, ec2front):
    start = _now() + dt.timedelta(hours=3)
    rid = ec2front.add_reservation(P5, "us-east-1c", 4, reservation_type="capacity-block", start=start,
                                   end=start + dt.timedelta(days=2))["CapacityReservationId"]
    name = unique("cbs")
    code, out, err = aws.ct(*UP, "--name", name, "--capacity-block", rid, "--dry-run")
    assert code == 0, err
    assert f"capacity block {rid}: 4 x {P5} in us-east-1c, scheduled" in out
    assert "it starts in 3h" in out and "`up` will exit saying so; add --wait to wait" in out
    code, out, err = aws.ct(*UP, "--name", name, "--capacity-block", rid)
    assert code == 75, err  # EX_TEMPFAIL: try again later
    assert _errors(err) == [f"error: capacity block {rid} (4 x {P5} in us-east-1c) starts at "
                            f"{start.strftime('%Y-%m-%d %H:%M')} UTC (in 3h); state scheduled: nothing was made"], err
    assert "add --wait" in err
    from clustertool.core import state

    assert not state.exists(name) and not _launches(ec2front) and aws.total_leaks(name) == 0


def test_up_wait_waits_for_the_start_then_launches_into_the_block_in_its_zone_and_down_leaves_nothing(
        aws, ec2front):
    start = _now() + dt.timedelta(seconds=3)
    end = start + dt.timedelta(days=1)
    rid = ec2front.add_reservation(P5, "us-east-1c", 4, reservation_type="capacity-block", start=start,
                                   end=end)["CapacityReservationId"]
    real_clock, looked = ec2front.clock, []

    def clock():  # `up`'s first look finds the block scheduled, however late a loaded machine lets it look
        if not looked:
            looked.append(True)
            return start - dt.timedelta(seconds=1)
        return real_clock()
    ec2front.clock = clock
    name = unique("cbw")
    code, out, err = aws.ct(*UP, "--name", name, "--capacity-block", rid, "--wait", "--block-end-warning", "45m")
    assert code == 0, err
    assert f"capacity block {rid} (4 x {P5} in us-east-1c) starts at" in err and "waiting for it" in err
    assert f"capacity block {rid} is active (4 of 4 free); launching" in err
    [run] = _launches(ec2front)
    assert run["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert run["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": rid}}
    assert run["Placement"]["AvailabilityZone"] == "us-east-1c" and "GroupName" not in run["Placement"]
    assert run["InstanceType"] == P5 and run["MinCount"] == run["MaxCount"] == 2
    assert len(ec2front.held_by(rid)) == 2
    from clustertool.core import state

    record = state.load(name)
    assert record.block_end == {"at": end.timestamp() - 1800, "end": end.timestamp(), "warning_s": 2700,
                                "signal": "TERM", "source": f"capacity block {rid}"}
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0, err
    assert f"capacity block: {rid}: 4 x {P5} in us-east-1c" in out
    assert "paid upfront with capacity block" in out
    assert "block end: capacity block " in out and "running jobs get SIGTERM 45m before" in out
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0 and ec2front.held_by(rid) == []
    from clustertool.cluster import ledger

    [up] = [e for e in ledger.read() if e["event"] == "up" and e["name"] == name]
    assert up["prepaid"] == f"capacity block {rid}"  # its hours are not priced again


@pytest.mark.parametrize("kind, flags, message", [
    ("odcr", (), "it is an On-Demand Capacity Reservation, not a Capacity Block"),
    ("type", ("--instance-type", "p4d.24xlarge"), f"it holds {P5}, not p4d.24xlarge"),
    ("few", ("-N", "8"), "it has 4 instance(s) free, fewer than --nodes 8"),
    ("az", ("--az", "us-east-1a"), "is in us-east-1c, not us-east-1a"),
])
def test_a_reservation_that_cannot_take_the_cluster_is_one_line_before_anything_is_made(aws, ec2front, kind, flags,
                                                                                        message):
    rtype = "default" if kind == "odcr" else "capacity-block"
    rid = ec2front.add_reservation(P5, "us-east-1c", 4, reservation_type=rtype, start=_now() - dt.timedelta(hours=1),
                                   end=_now() + dt.timedelta(days=1))["CapacityReservationId"]
    name = unique("cbb")
    code, _, err = aws.ct(*UP, "--name", name, "--capacity-block", rid, *flags)
    assert code == 2 and "Traceback" not in err, err
    assert len(_errors(err)) == 1 and message in _errors(err)[0], err
    assert not _launches(ec2front) and aws.total_leaks(name) == 0


def test_block_flags_without_a_block_are_refused(aws, ec2front):
    code, _, err = aws.ct(*UP, "--name", unique("cbf"), "--instance-type", P5, "--wait")
    assert code == 2 and _errors(err) == ["error: --wait: only means something with --capacity-block"], err


def test_sigterm_while_up_waits_for_the_block_ends_at_once_and_leaves_nothing(aws, ec2front):
    start = _now() + dt.timedelta(hours=2)
    rid = ec2front.add_reservation(P5, "us-east-1c", 2, reservation_type="capacity-block", start=start,
                                   end=start + dt.timedelta(days=1))["CapacityReservationId"]
    name = unique("cbt")
    proc = subprocess.Popen([sys.executable, "-m", "clustertool", *UP, "--name", name, "--capacity-block", rid,
                             "--wait"], env=dict(os.environ), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:  # its progress lines, until it says it waits
            seen.append(line)
            if "waiting for it" in line:
                break
        assert proc.poll() is None, "".join(seen)
        from clustertool.core import state

        assert state.holder(name) is not None  # a second `up` of the name is refused meanwhile
        proc.send_signal(signal.SIGTERM)
        # the wait would last two hours: ending by the signal, with its one line, is the event (the deadline
        # only bounds a process that ignores it; the seconds a loaded machine takes to roll back are not asserted)
        _, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert _errors(rest) == ["error: up stopped by SIGTERM before it made anything"], rest
    assert not state.exists(name) and not _launches(ec2front) and aws.total_leaks(name) == 0
