"""`report`'s pure parts: a job's record as series and events, the page, the PNG."""

from __future__ import annotations

import json

import pytest

from clustertool.core.errors import StateError
from clustertool.watch import report, report_html, runrecord

pytestmark = pytest.mark.unit

HEADER = {"header": {"job": "j1", "name": "demo", "nodes": [["node-1", "leader"], ["node-2", "member"],
                                                              ["node-3", "member"]], "interval": 2.0, "since": 100.0}}


def line(t, cordoned=(), slow=(), net_out=(), gpu=None, steps=(5.0, 5.0, 2.0)):
    nodes = {f"node-{i}": [gpu, 10.0 * i, 1000.0 * i, 2000.0 * i, int(f"node-{i}" in cordoned), 1] for i in (1, 2, 3)}
    ranks = {str(i - 1): [f"node-{i}", int(t), steps[i - 1], 1.0 / steps[i - 1]] for i in (1, 2, 3)}
    return {"t": t, "nodes": nodes, "ranks": ranks, "out": {"ranks": list(slow), "nodes": list(net_out)}}


def record(lines, attempts=None):
    files = {"watch/samples.jsonl": "\n".join(json.dumps(d) for d in [HEADER] + lines) + "\n{cut sho"}
    if attempts is not None:
        files["attempts.json"] = json.dumps(attempts)
    return runrecord.load(files, "j1")


def test_series_per_node_and_cpu_when_no_gpu():
    run = record([line(100.0), line(102.0), line(104.0)])
    assert run.t == [0.0, 2.0, 4.0] and run.nodes == ["node-1", "node-2", "node-3"]
    assert run.utilisation == "CPU" and run.gpu["node-2"] == [20.0, 20.0, 20.0]
    assert run.steps["node-3"] == [2.0, 2.0, 2.0] and run.net["node-1"] == [24000.0] * 3  # bits: 8 x (rx + tx)
    with_gpu = record([line(100.0, gpu=90.0)])
    assert with_gpu.utilisation == "GPU" and with_gpu.gpu["node-1"] == [90.0]


def test_stragglers_cordons_and_restarts_become_events():
    lines = [line(100.0), line(102.0, slow=[2]), line(104.0, slow=[2], cordoned=["node-3"]),
             line(106.0, cordoned=["node-3"], net_out=["node-2"]), line(108.0)]
    run = record(lines, {"attempts": [{"attempt": 1, "start": 90.0}, {"attempt": 2, "start": 105.0}]})
    got = [(e.kind, e.t, e.end, e.label) for e in run.events]
    assert ("straggler", 2.0, 4.0, "straggler rank 2 (node-3)") in got
    assert ("cordon", 4.0, None, "cordon node-3") in got
    assert ("network", 6.0, 6.0, "network node-2") in got
    assert ("restart", 5.0, None, "restart 1") in got
    assert [e.t for e in run.events] == sorted(e.t for e in run.events)


def test_a_node_cordoned_before_the_job_is_no_event():
    run = record([line(100.0, cordoned=["node-2"]), line(102.0, cordoned=["node-2"])])
    assert [e for e in run.events if e.kind == "cordon"] == []


def test_no_record_says_how_to_get_one():
    with pytest.raises(StateError, match="no watch record") as info:
        runrecord.load({}, "j9")
    assert "unless run with --no-record" in (info.value.hint or "")


def test_the_leaders_files_come_back_whole():
    script = report.fetch_script("j1-ab")
    assert "'.clustertool/jobs'" not in script and "/j1-ab/watch/samples.jsonl" in script
    text = "FILE watch/samples.jsonl\neyJ0IjogMX0=\nFILE attempts.json\nbm90IGJhc2U2NA==\n"
    assert report.parse_files(text) == {"watch/samples.jsonl": '{"t": 1}', "attempts.json": "not base64"}


def test_the_page_is_self_contained_with_three_panels_and_the_marks(tmp_path):
    lines = [line(100.0 + 2 * i, slow=[2] if 3 <= i <= 6 else [], cordoned=["node-1"] if i >= 5 else [])
             for i in range(10)]
    run = record(lines, {"attempts": [{"attempt": 2, "start": 110.0}]})
    page = report_html.page(run)
    for key, _ in report_html.PANELS:
        assert f'id="panel-{key}"' in page
    assert page.count('class="mark-straggler"') == 1 and page.count('class="mark-cordon"') == 3
    assert page.count('class="mark-restart"') == 3 and "no GPU on any node, CPU shown" in page
    assert "<script" not in page and "src=" not in page and "href=" not in page   # nothing to fetch
    files = report.write(run, tmp_path / "out" / "r")
    assert files.html == str(tmp_path / "out" / "r.html")
    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (the train extra)")
    assert files.png == str(tmp_path / "out" / "r.png")
    assert (tmp_path / "out" / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
