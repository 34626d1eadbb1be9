"""Capacity Blocks, the pure parts: requests checked against botocore's own EC2 model, offerings'
per-hour figures, the checks `up --capacity-block` makes, the block-end record and its watcher's
timing (nodeprogs/autostop.py, with a real process standing for a rank), and the ledger's purchase."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from clustertool.cluster import autostop, blockend, ledger
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node
from clustertool.nodeprogs import DIR
from clustertool.providers.aws import az_launch, capacity_blocks, capacity_offers, tags
from clustertool.providers.aws.capacity_blocks import Reservation
from clustertool.providers.aws.images import Image

pytestmark = pytest.mark.unit
UTC = dt.timezone.utc
NOW = 1_800_000_000.0

_spec = importlib.util.spec_from_file_location("watcher", DIR / "autostop.py")
watcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(watcher)


def _validate(operation: str, params: dict) -> None:
    """botocore's own check of a request against the EC2 model (what the real client does first)."""
    import botocore.session
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("ec2").operation_model(operation)
    validate_parameters(params, model.input_shape)


def test_the_offerings_request_is_what_the_ec2_model_takes():
    query = capacity_offers.Query("p5.48xlarge", 4, 2, "2026-12-01", "2026-12-10T08:00Z")
    params = query.params()
    _validate("DescribeCapacityBlockOfferings", params)
    assert params["CapacityDurationHours"] == 48 and params["InstanceCount"] == 4
    assert params["StartDateRange"] == dt.datetime(2026, 12, 1, tzinfo=UTC)
    assert params["EndDateRange"] == dt.datetime(2026, 12, 10, 8, tzinfo=UTC)


@pytest.mark.parametrize("query, message", [
    (capacity_offers.Query("p5.48xlarge", 0, 2), "--nodes: expected 1 or more"),
    (capacity_offers.Query("p5.48xlarge", 4, 0), "--days: a Capacity Block lasts 1 to 182 days"),
    (capacity_offers.Query("p5.48xlarge", 4, 2, "2026-12-05", "2026-12-01"), "--end-before must be after"),
    (capacity_offers.Query("p5.48xlarge", 4, 2, "Dec 5"), "invalid --start-after 'Dec 5'"),
])
def test_bad_offering_queries_are_one_usage_error(query, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        query.check()


def test_an_offering_gives_its_fee_per_instance_hour_and_per_cluster_hour():
    o = capacity_offers.offering_from({"CapacityBlockOfferingId": "cb-1", "InstanceType": "p5.48xlarge",
                                       "AvailabilityZone": "us-east-1b", "InstanceCount": 4,
                                       "StartDate": dt.datetime(2026, 12, 1, tzinfo=UTC),
                                       "EndDate": dt.datetime(2026, 12, 3, tzinfo=UTC),
                                       "CapacityBlockDurationHours": 48, "UpfrontFee": "30000.00",
                                       "CurrencyCode": "USD"})
    assert (o.per_node_hour, o.per_cluster_hour) == (156.25, 625.0)
    assert o.to_dict()["start"] == "2026-12-01 00:00 UTC"


def _block(**kw) -> Reservation:
    base = dict(id="cr-1", type="capacity-block", state="active", instance_type="p5.48xlarge", az="us-east-1c",
                total=4, free=4, start=NOW - 3600, end=NOW + 86400)
    base.update(kw)
    return Reservation(**base)


@pytest.mark.parametrize("block, count, found", [
    (_block(), 4, []),
    (_block(state="scheduled", free=0, start=NOW + 600), 4, []),  # before its start, its total counts
    (_block(free=1), 2, ["it has 1 instance(s) free, fewer than --nodes 2"]),
    (_block(type="default"), 2, ["it is an On-Demand Capacity Reservation, not a Capacity Block"]),
    (_block(instance_type="p4d.24xlarge"), 2, ["it holds p4d.24xlarge, not p5.48xlarge"]),
    (_block(state="expired", end=NOW - 60), 2, ["it is expired"]),
    (_block(end=NOW + 600), 2, ["EC2 is already taking its instances back"]),  # 30 min before the end
])
def test_what_up_checks_of_a_block_before_anything_is_made(block, count, found):
    got = capacity_blocks.problems(block, "p5.48xlarge", count, now=NOW)
    assert len(got) == len(found) and all(g.startswith(f) for g, f in zip(got, found)), got


def test_a_block_that_has_not_started_without_wait_says_when_and_exits_75():
    block = _block(state="scheduled", start=time.time() + 3 * 3600)
    with pytest.raises(capacity_blocks.BlockNotStarted) as caught:
        capacity_blocks.wait_for_start(None, block, wait=False)  # no AWS call is made
    assert caught.value.exit_code == 75 and "starts at" in caught.value.message
    assert caught.value.message.endswith("state scheduled: nothing was made") and "--wait" in caught.value.hint


def test_the_launch_into_a_block_is_a_run_instances_request_the_ec2_model_takes():
    options = {"capacity_block": "cr-0abc", "volume_type": "gp3"}
    params = az_launch.launch_params(stamp=tags.Stamp("c", "c-1"), count=2, instance_type="p5.48xlarge",
                                     image=Image("ami-1", "x", "/dev/sda1", "x86_64"), subnet="subnet-1",
                                     group_id="sg-1", key_name="k", az="us-east-1c", placement_group=None,
                                     options=options, token="t")
    _validate("RunInstances", params)
    assert params["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert params["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == "cr-0abc"
    assert "GroupName" not in params["Placement"]
    assert "InstanceMarketOptions" not in az_launch.launch_params(
        stamp=tags.Stamp("c", "c-1"), count=2, instance_type="p5.48xlarge", image=Image("ami-1", "x", "/dev/sda1",
                                                                                        "x86_64"),
        subnet="s", group_id="g", key_name="k", az="a", placement_group="pg", options={}, token="t")


@pytest.mark.parametrize("options, message", [
    ({"wait": True}, "--wait: only means something with --capacity-block"),
    ({"block_end_warning": "10m"}, "--block-end-warning: only means something with --capacity-block"),
    ({"capacity_block": "i-123"}, "expected a capacity reservation id"),
    ({"capacity_block": "cr-1", "spot": True}, "--capacity-block does not go with --spot"),
    ({"capacity_block": "cr-1", "block_end_signal": "KILL"}, "--block-end-signal 'KILL'"),
    ({"capacity_block": "cr-1", "block_end_warning": "soon"}, "invalid --block-end-warning 'soon'"),
])
def test_bad_block_options_are_one_usage_error(options, message):
    with pytest.raises(UsageError, match=message):
        capacity_blocks.validate(options)


def test_a_block_clusters_end_record_is_thirty_minutes_before_the_blocks_end():
    record = capacity_blocks.block_end_record(_block(), {"block_end_warning": "1h", "block_end_signal": "SIGUSR1"})
    assert record == {"at": NOW + 86400 - 1800, "end": NOW + 86400, "warning_s": 3600, "signal": "USR1",
                      "source": "capacity block cr-1"}


def _cluster(block_end=None) -> ClusterRecord:
    return ClusterRecord(name="c", provider="local", status="ready", block_end=block_end,
                         nodes=[Node(name="node-1", index=1, address="10.0.0.1", role=LEADER)])


def test_block_end_requests_keep_what_they_do_not_change_and_refuse_nonsense():
    new = blockend.request(_cluster(), "+90s", None, None, False, now=NOW)
    assert new["at"] == NOW + 90 and new["warning_s"] == 1800 and new["signal"] == "TERM"
    changed = blockend.request(_cluster(new), None, "5m", "sigint", False, now=NOW)
    assert (changed["at"], changed["warning_s"], changed["signal"]) == (NOW + 90, 300, "INT")
    assert blockend.request(_cluster(new), None, None, None, True) is None
    assert blockend.parse_at("2026-12-01T08:00") == dt.datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp()
    for args, message in [((None, None, None, False), "has no block end yet: give --at"),
                          (("+1h", None, None, True), "--off removes the block end: give it alone"),
                          (("+1h", None, "KILL", False), "--block-end-signal 'KILL'")]:
        with pytest.raises(UsageError, match=message):
            blockend.request(_cluster(), *args)


def test_the_watchers_config_carries_the_block_end():
    block = {"at": NOW, "warning_s": 60, "signal": "TERM", "source": "x"}
    assert autostop.watcher_config(_cluster(block), None, "true", now=NOW)["block_end"] == block


def test_the_watcher_signals_a_running_jobs_rank_once_from_the_warning_time_on(tmp_path, monkeypatch):
    """nodeprogs/autostop.py's block_end_tick with a real process as the job's one rank on this node."""
    monkeypatch.setattr(watcher, "DIR", str(tmp_path / "autostop"))
    os.makedirs(watcher.DIR)
    jobs = tmp_path / "jobs"
    (jobs / "j1" / "ranks").mkdir(parents=True)
    (jobs / "j1" / "job.json").write_text(json.dumps({"nodes": ["node-1"]}))
    rank = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\nprint('ready', flush=True)\n"
                             "time.sleep(60)"], env={**os.environ, "CLUSTERTOOL_JOB": "j1"}, stdout=subprocess.PIPE)
    try:
        assert rank.stdout.readline() == b"ready\n"  # its handler is in place
        (jobs / "j1" / "launch.pid").write_text(f"{rank.pid} 1 1 1\n")
        (jobs / "j1" / "ranks" / f"{os.uname().nodename}.0").write_text(f"{rank.pid} 1 1 1\n")
        monkeypatch.setattr(watcher, "SIGNAL_RANKS", watcher.SIGNAL_RANKS.replace(
            '"$HOME/.clustertool/jobs/$1"', f'"{jobs}/$1"'))
        config = {"leader": "node-1", "members": [],
                  "block_end": {"at": NOW + 100, "warning_s": 30, "signal": "USR1", "source": "capacity block cr-1"}}
        assert watcher.block_end_tick(config, NOW + 69, str(jobs)) == []  # before the warning time
        assert rank.poll() is None
        assert watcher.block_end_tick(config, NOW + 70, str(jobs)) == ["j1"]
        assert rank.wait(10) == 7  # it got SIGUSR1
        note = json.loads((jobs / "j1" / "blockend").read_text())
        assert note["signal"] == "USR1" and note["ranks"] == {"node-1": [rank.pid]}
        assert watcher.block_end_tick(config, NOW + 71, str(jobs)) == []  # once per job
        assert "block end: signalled USR1 to job j1 (1 rank(s) on node-1)" in (tmp_path / "autostop" /
                                                                            "autostop.log").read_text()
    finally:
        rank.kill()
        rank.wait()


def test_the_ledger_counts_a_purchase_once_and_a_prepaid_clusters_hours_at_zero():
    events = [{"t": NOW, "event": "purchase", "id": "cr-1", "name": "capacity block cr-1", "provider": "aws",
               "type": "p5.48xlarge", "nodes": 4, "usd": 30000.0},
              {"t": NOW + 10, "event": "up", "id": "c-1", "name": "c", "provider": "aws", "type": "p5.48xlarge",
               "nodes": 4, "prepaid": "capacity block cr-1"},
              {"t": NOW + 7210, "event": "down", "id": "c-1", "name": "c"}]
    rows = {c.id: c for c in ledger.summarize(events, now=NOW + 9000)}
    assert rows["cr-1"].cost == 30000.0 and rows["cr-1"].state == "purchase"
    assert rows["c-1"].hours_up == 2.0 and rows["c-1"].cost == 0.0
    assert any("prepaid: capacity block cr-1" in n for n in rows["c-1"].notes)
    assert ledger.summarize(events, now=NOW + 9000, since=NOW + 1)[0].id == "c-1"  # bought before `since`
