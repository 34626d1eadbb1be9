"""The hub's views: outliers (1.25x off the median, 3 readings in a row), metrics, a job's record."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from clustertool.nodeprogs import watchcore, watchrecord
from clustertool.watch.view import gpu_cells, node_state, rank_row, ranks_shown, summary_lines

pytestmark = pytest.mark.unit

NODES = [("node-1", "10.0.0.1", "leader"), ("node-2", "10.0.0.2", "member"), ("node-3", "10.0.0.3", "member"),
         ("node-4", "10.0.0.4", "member")]


def state(**extra):
    return dict({"nodes": NODES, "leader": "node-1", "cordoned": set(), "link_bps": 200_000_000, "interval": 1.0,
                 "streaks": watchcore.Streaks()}, **extra)


def sample(tx=25e6, rx=25e6, ranks=None):
    return {"cpu": 10.0, "rx": rx, "tx": tx, "gpus": None, "jobs": {"j1": ranks or {}}}


def reading(st, samples, jobs=(), t=0.0):
    return watchcore.build_view(st, {n: (s, t, "ok", None) for n, s in samples.items()}, list(jobs), 1000.0 + t, t)


def test_a_node_at_a_quarter_of_the_others_is_flagged_on_the_third_reading():
    st = state()
    samples = {"node-1": sample(), "node-2": sample(), "node-3": sample(tx=6.25e6), "node-4": sample()}
    flags = [reading(st, samples, t=i)["outliers"]["nodes"] for i in range(3)]
    assert flags == [[], [], ["node-3"]]
    view = reading(st, samples, t=3)
    row = next(r for r in view["nodes"] if r["name"] == "node-3")
    assert row["net_outlier"] == ["tx"] and row["net_ratio"]["tx"] == pytest.approx(0.25)
    assert row["link_source"] == "recorded" and row["link_bps"] == 200_000_000
    assert "node-3: network tx at x0.25 of the nodes' median" in summary_lines(view)


def test_one_reading_back_in_line_starts_the_count_again():
    st = state()
    odd = {"node-1": sample(), "node-2": sample(), "node-3": sample(tx=1e6), "node-4": sample()}
    even = dict(odd, **{"node-3": sample()})
    seen = [reading(st, s, t=i)["outliers"]["nodes"] for i, s in enumerate([odd, odd, even, odd, odd, odd])]
    assert seen == [[], [], [], [], [], ["node-3"]]


def test_idle_networks_and_too_few_nodes_flag_nothing():
    st = state()
    idle = {"node-1": sample(tx=1000), "node-2": sample(tx=1000), "node-3": sample(tx=50), "node-4": sample(tx=1000)}
    two = {"node-1": sample(), "node-2": sample(tx=1e6)}
    st2 = state(nodes=NODES[:2])
    for i in range(4):
        assert reading(st, idle, t=i)["outliers"]["nodes"] == []
        assert reading(st2, two, t=i)["outliers"]["nodes"] == []


def test_a_slow_rank_is_named_and_the_slowest_listed_first():
    st = state()
    fast = {"step": 40, "rate": 5.0, "step_time": 0.2, "age": 0.1}
    slow = {"step": 16, "rate": 2.0, "step_time": 0.5, "age": 0.3}
    samples = {"node-1": sample(ranks={"0": fast, "1": fast}), "node-2": sample(ranks={"2": fast, "3": fast}),
               "node-3": sample(ranks={"4": slow, "5": fast})}
    job = {"id": "j1", "name": "demo"}
    for i in range(3):
        view = reading(st, samples, [job], t=i)
    j = view["jobs"][0]
    assert j["outliers"] == [4] and j["slowest"][0] == 4 and j["median_step_time"] == pytest.approx(0.2)
    rank4 = next(r for r in j["ranks"] if r["rank"] == 4)
    assert rank4["node"] == "node-3" and rank4["ratio"] == pytest.approx(2.5) and not rank4["stalled"]
    assert ranks_shown(j, 2)[0]["rank"] == 4
    assert "job j1: rank 4 on node-3 step time x2.50 of the median" in summary_lines(view)


def test_a_silent_rank_is_stalled():
    st = state()
    ok = {"step": 40, "rate": 5.0, "step_time": 0.2, "age": 0.1}
    silent = {"step": 12, "rate": 5.0, "step_time": 0.2, "age": 95.0}
    done = dict(silent, ended=True)   # its wrapper recorded how it ended: finished, not stalled
    samples = {"node-1": sample(ranks={"0": ok}), "node-2": sample(ranks={"1": ok}),
               "node-3": sample(ranks={"2": silent, "3": done})}
    for i in range(3):
        view = reading(st, samples, [{"id": "j1"}], t=i)
    assert view["jobs"][0]["outliers"] == [2]
    assert next(r for r in view["jobs"][0]["ranks"] if r["rank"] == 2)["stalled"]
    assert rank_row(next(r for r in view["jobs"][0]["ranks"] if r["rank"] == 3))[-1] == ("ended", "")


def test_cordons_unreachable_and_stale_nodes_show():
    st = state(cordoned={"node-2"})
    samples = {"node-1": (sample(), 10.0, "ok", None), "node-2": (sample(), 10.0, "ok", None),
               "node-3": (None, None, "unreachable", "ssh: connect to host 10.0.0.3 port 22: Connection refused"),
               "node-4": (sample(), 1.0, "ok", None)}
    view = watchcore.build_view(st, samples, [], 1000.0, 10.0)
    states = {r["name"]: (r["state"], r["cordoned"]) for r in view["nodes"]}
    assert states == {"node-1": ("ok", False), "node-2": ("ok", True), "node-3": ("unreachable", False),
                      "node-4": ("stale", False)}
    cells = {r["name"]: node_state(r)[0] for r in view["nodes"]}
    assert cells["node-2"] == "cordoned" and cells["node-3"].startswith("unreachable: ssh: connect")


def test_gpu_cells_say_no_gpu_and_name_clock_reasons():
    assert gpu_cells(None)[0] == ("no GPU", "muted")
    gpus = [{"util": 90.0, "mem_used": 2**30, "mem_total": 4 * 2**30, "power": 300.0, "temp": 60.0,
             "reasons": ["idle"]},
            {"util": 70.0, "mem_used": 2**30, "mem_total": 4 * 2**30, "power": 310.0, "temp": 75.0,
             "reasons": ["sw_power_cap"]}]
    cells = [text for text, _ in gpu_cells(gpus)]
    assert cells == ["2x 80%", "2.0 GiB / 8.0 GiB", "610 W", "75 C", "sw_power_cap"]


def test_the_metrics_are_prometheus_text_format():
    st = state(cordoned={"node-4"})
    ranks = {"0": {"step": 3, "rate": 2.0, "step_time": 0.5, "age": 1.0}}
    samples = {n: sample(ranks=ranks if n == "node-1" else {}) for n, _, _ in NODES}
    view = reading(st, samples, [{"id": "j1", "name": 'a "quoted"\nname'}])
    text = watchcore.metrics_text(view, {"hourly": 12.5, "so_far": 3.0})
    assert 'clustertool_node_cordoned{node="node-4",role="member"} 1.0' in text
    assert 'clustertool_rank_step{job_id="j1",rank="0",node="node-1"} 3.0' in text
    assert 'job_name="a \\"quoted\\"\\nname"' in text
    assert text.count("# TYPE clustertool_rank_step gauge") == 1
    promtool = shutil.which("promtool")
    if promtool:  # the real linter from Debian's prometheus package
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_record_keeps_a_header_and_thins_itself(tmp_path):
    job = {"id": "j1", "name": "demo", "nodes": ["node-1"]}
    view = reading(state(nodes=NODES[:1]), {"node-1": sample()})
    rec = watchrecord.Record(job, NODES[:1], 1.0, jobs_dir=str(tmp_path), limit=4000)
    assert rec.held
    other = watchrecord.Record(job, NODES[:1], 1.0, jobs_dir=str(tmp_path))
    assert not other.held   # one recorder per job: the second leaves it to the first
    for _ in range(60):
        rec.add(view)
    lines = (tmp_path / "j1" / "watch" / "samples.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["header"]["job"] == "j1"
    assert rec.stride > 1 and len("\n".join(lines)) <= 4000 + 200
    assert all("nodes" in json.loads(line) for line in lines[1:])
    rec.close()
    other.close()
