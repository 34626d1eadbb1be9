"""The cost ledger's arithmetic: hours up, stopped and saved by autostop, cost from the price table."""

from __future__ import annotations

import pytest

from clustertool.cluster import ledger
from clustertool.core.model import ClusterRecord, Node

pytestmark = pytest.mark.unit

H = 3600.0


def _e(t_h: float, event: str, cid: str = "a-1", **kw) -> dict:
    base = {"t": t_h * H, "event": event, "id": cid, "name": cid.split("-")[0], "provider": "aws",
            "type": "p4d.24xlarge", "nodes": 4, "spot": False}
    return {**base, **kw}


def test_a_cluster_up_two_hours_then_down_costs_two_hours_of_four_nodes():
    [c] = ledger.summarize([_e(0, "up"), _e(2, "down")], now=10 * H)
    assert (c.hours_up, c.hours_stopped, c.hours_saved, c.state) == (2.0, 0.0, 0.0, "down")
    assert c.cost == pytest.approx(2 * 4 * 32.7726)


def test_stop_and_start_split_hours_up_from_hours_stopped():
    [c] = ledger.summarize([_e(0, "up"), _e(1, "stop"), _e(4, "start"), _e(4.5, "down")], now=9 * H)
    assert (c.hours_up, c.hours_stopped) == (1.5, 3.0)


def test_autostop_counts_saved_hours_until_the_user_comes_back():
    events = [_e(0, "up"), _e(3, "autostop"), _e(8, "start"), _e(9, "down")]
    [c] = ledger.summarize(events, now=20 * H)
    assert (c.hours_up, c.hours_stopped, c.hours_saved) == (4.0, 5.0, 5.0)
    assert c.saved == pytest.approx(5 * 4 * 32.7726)


def test_a_live_cluster_keeps_counting_until_now_and_an_autostopped_one_keeps_saving():
    live, stopped = ledger.summarize([_e(0, "up", "a-1"), _e(1, "up", "b-2"), _e(2, "autostop", "b-2")], now=5 * H)
    assert (live.state, live.hours_up) == ("running", 5.0)
    assert (stopped.state, stopped.hours_up, stopped.hours_stopped, stopped.hours_saved) == (
        "autostopped", 1.0, 3.0, 3.0)


def test_autodown_ends_the_bill_and_saves_until_down_is_run():
    [c] = ledger.summarize([_e(0, "up"), _e(2, "autodown"), _e(6, "down")], now=10 * H)
    assert (c.hours_up, c.hours_stopped, c.hours_saved, c.state) == (2.0, 0.0, 4.0, "down")


def test_since_clips_every_span_and_leaves_out_clusters_gone_before_it():
    events = [_e(0, "up", "old-1"), _e(1, "down", "old-1"), _e(0, "up", "a-1"), _e(4, "stop", "a-1")]
    [c] = ledger.summarize(events, now=6 * H, since=3 * H)
    assert (c.id, c.hours_up, c.hours_stopped) == ("a-1", 1.0, 2.0)


def test_local_costs_nothing_unknown_types_and_spot_are_unpriced():
    local, odd, spot = ledger.summarize([
        _e(0, "up", "l-1", provider="local", type="local"), _e(0, "up", "o-1", type="x9.huge"),
        _e(0, "up", "s-1", spot=True)], now=H)
    assert local.cost == 0.0 and odd.cost is None and spot.cost is None
    assert odd.notes == ["no price known for x9.huge"] and spot.notes == ["spot price not recorded"]


def test_report_totals_and_json_say_approximate(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    cluster = ClusterRecord(name="t", provider="aws", id="t-1", nodes=[Node(name="node-1", index=1, address="")],
                      provider_state={"instance_type": "g5.xlarge"})
    ledger.record("up", cluster, t=0.0)
    ledger.record("autostop", cluster, t=2 * H)
    report = ledger.report(now=3 * H)
    data = report.to_dict()
    assert data["approximate"] is True and "approximate" in data["basis"]
    assert data["total_usd"] == round(2 * 1.006, 2) and data["saved_usd"] == round(1.006, 2)
    assert data["clusters"][0]["type"] == "g5.xlarge" and data["clusters"][0]["state"] == "autostopped"


def test_record_refuses_unknown_events_and_read_skips_broken_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    with pytest.raises(ValueError):
        ledger.record("explode", ClusterRecord(name="t", provider="local"))
    ledger.path().write_text('{"t": 1, "event": "up", "id": "x"}\nnot json\n{"t": "x", "event": "up"}\n')
    assert [e["id"] for e in ledger.read()] == ["x"]


def test_clusters_made_before_the_ledger_count_from_their_creation(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    old = ClusterRecord(name="old", provider="aws", id="old-1", created=1 * H, status="ready",
                  nodes=[Node(name="node-1", index=1, address="")], provider_state={"instance_type": "g5.xlarge"})
    [c] = ledger.report(now=4 * H, known=[old]).clusters
    assert (c.id, c.hours_up, c.state) == ("old-1", 3.0, "running")


def test_a_swept_cluster_is_gone_from_then_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    cluster = ClusterRecord(name="t", provider="local", id="t-1", nodes=[Node(name="node-1", index=1, address="")])
    ledger.record("up", cluster, t=0.0)
    ledger.record_gone("t", "t-1")
    [c] = ledger.report().clusters
    assert c.state == "down" and c.nodes == 1 and c.type == "local"
