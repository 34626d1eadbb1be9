"""Stragglers from the reducers' lateness records, on records two real reducers wrote (tests/unit/data/
stragglers-recorded: 4 ranks of the plugin's servers allreduce, rank 2 slowed on purpose, and a run with none
slowed), and on the plugin's own CollNet stats of runs without servers (recorded the same way)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clustertool.core.model import ClusterRecord, JobRecord, Node
from clustertool.nodeprogs import watchcore, watchlate, watchnode
from clustertool.watch import runrecord, stragglers, view

pytestmark = pytest.mark.unit
DATA = Path(__file__).parent / "data" / "stragglers-recorded"
NODES = [["node-1", "10.0.0.1", "leader"], ["node-2", "127.0.0.1", "member"], ["server-1", "10.0.0.9", "server"]]


def lines(run: str) -> list[list[dict]]:
    """Each reducer file's lines, in file order."""
    return [[json.loads(x) for x in f.read_text().splitlines()] for f in sorted((DATA / run).glob("*.jsonl"))]


def last(run: str) -> list[dict]:
    return [f[-1] for f in lines(run)]


def test_the_rank_slowed_on_purpose_is_named_and_nobody_in_an_even_run():
    workers, bounds = watchlate.merge(last("slow-rank-2"))
    rows = watchlate.summary(workers, bounds)
    assert [r["worker"] for r in rows if r["straggler"]] == ["2"] and rows[0]["worker"] == "2"
    assert rows[0]["last_share"] > 0.9 and rows[0]["p50_us"] >= 16384 and rows[0]["requests"] == 2400
    assert all(r["requests"] == 2400 for r in rows)   # 2 reducers x 150 allreduces x 8 chunks, every worker
    even, bounds = watchlate.merge(last("even"))
    assert [r["worker"] for r in watchlate.summary(even, bounds) if r["straggler"]] == []


def test_each_second_of_the_slowed_run_names_it_once_the_readings_differ():
    per_file = lines("slow-rank-2")
    before, named = None, []
    for i in range(min(len(f) for f in per_file) - 1):   # the last line of each: the session's end, a few requests
        now, bounds = watchlate.merge([f[i] for f in per_file])
        rows = watchlate.summary(watchlate.minus(now, before) if before else now, bounds)
        named.append([r["worker"] for r in rows if r["straggler"]])
        before = now
    assert named and all(n == ["2"] for n in named), named


def test_quantiles_read_the_bucket_bound_and_the_open_bucket_as_twice_the_last():
    bounds = [1, 2, 4, 8]
    assert watchlate.quantile_us([0, 0, 0, 0, 0], bounds, 0.5) is None
    assert watchlate.quantile_us([5, 3, 1, 1, 0], bounds, 0.5) == 1
    assert watchlate.quantile_us([5, 3, 1, 1, 0], bounds, 0.99) == 8
    assert watchlate.quantile_us([0, 0, 0, 0, 4], bounds, 0.5) == 16


def test_two_workers_one_last_nearly_always_is_named_the_other_never():
    hist = [0] * 24
    slow = dict(peer="10.0.0.2:1", last=95, waited_for_us=95 * 20_000, late_sum_us=100 * 20_000,
                late_hist=hist[:15] + [100] + hist[16:])
    fast = dict(peer="10.0.0.1:1", last=5, waited_for_us=5 * 200, late_sum_us=500, late_hist=[95, 0, 0, 0, 0, 0, 0, 0,
                                                                                             5] + hist[9:])
    doc = {"v": 1, "buckets_us": [2 ** k for k in range(23)], "workers": {"0": fast, "1": slow}}
    assert [r["worker"] for r in watchlate.summary(*watchlate.merge([doc])) if r["straggler"]] == ["1"]
    assert watchlate.merge([{"v": 2, "workers": {}, "buckets_us": []}]) == ({}, [])   # a format this code cannot read


def sample(job: str, docs: dict[str, dict]) -> dict:
    return {"cpu": 1.0, "rx": 0, "tx": 0, "jobs": {job: {}}, "stragglers": {job: docs}}


def test_top_names_the_straggler_with_its_node_and_the_exporter_says_so():
    state = {"nodes": NODES, "leader": "node-1", "cordoned": set(), "link_bps": None, "interval": 1.0,
             "streaks": watchcore.Streaks()}
    per_file = lines("slow-rank-2")
    job = {"id": "j1128-aaaaaa", "name": None, "nodes": ["node-1", "node-2"], "out": "/x/out", "started": 0}
    for i in range(3):
        docs = {f"f{k}": f[i] for k, f in enumerate(per_file)}
        samples = {"server-1": (sample(job["id"], docs), 0.0, "ok", None)}
        v = watchcore.build_view(state, samples, [job], 100.0 + i, 0.0)
    late = v["jobs"][0]["stragglers"]
    assert late["flagged"] == ["2"] and late["workers"][0]["node"] == "node-2"   # its peer's address is node-2's
    assert late["workers"][0]["now"]["requests"] > 0 and v["outliers"]["late"] == {job["id"]: ["2"]}
    assert any("worker 2 on node-2 made the others wait: p50" in line for line in view.summary_lines(v))
    assert "STRAGGLERS: worker 2 (node-2)" in view.job_title(v["jobs"][0])
    text = watchcore.metrics_text(v)
    assert f'clustertool_worker_straggler{{job_id="{job["id"]}",worker="2",node="node-2"}} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make apt` installs it (Debian package prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    line = watchcore.record_line(v, job["id"])
    assert line["late"]["2"][0] == "node-2" and line["out"]["late"] == ["2"]
    run = runrecord.series([line, dict(line, t=line["t"] + 5)], {"job": job["id"], "nodes": [["node-2", "member"]]})
    assert [(e.kind, e.node, e.label, e.end) for e in run.events] == [
        ("straggler", "node-2", "late worker 2 (node-2) at the reducers", 5.0)]   # the report's band


def test_the_sampler_reads_the_last_whole_line_of_each_record(tmp_path):
    folder = tmp_path / "j1" / "stragglers"
    folder.mkdir(parents=True)
    src = sorted((DATA / "slow-rank-2").glob("*.jsonl"))[0]
    text = src.read_text().splitlines()
    (folder / src.name).write_text("\n".join(text[:3]) + "\n" + text[3][:100])   # the reducer mid-write
    job = watchnode.Job("j1", str(tmp_path / "j1" / "out"), [])
    assert job.lateness() == {src.name: json.loads(text[2])}
    with open(folder / src.name, "a") as fh:
        fh.write(text[3][100:] + "\n")
    assert job.lateness() == {src.name: json.loads(text[3])}


def record(job_id="j1128-bbbbbb", servers=("server-1",)) -> tuple[JobRecord, ClusterRecord]:
    nodes = [Node(n, i + 1, a, role=r) for i, (n, a, r) in enumerate(NODES)]
    return (JobRecord(id=job_id, cluster="c", command=["x"], argv=["x"], nodes=["node-1", "node-2"], np=2,
                      servers=list(servers)), ClusterRecord("c", "local", nodes=nodes))


def test_the_nodes_answer_is_read_back_and_the_report_names_the_worker(tmp_path):
    job, cluster = record()
    d = tmp_path / ".clustertool" / "jobs" / job.id
    shutil.copytree(DATA / "slow-rank-2", d / "stragglers")
    out = subprocess.run(["sh", "-c", stragglers.read_script(job.id)], capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(tmp_path)))
    docs, stats = stragglers.parse(out.stdout + "LATE broken {not json\n")
    assert sorted(docs) == sorted(f.name for f in (DATA / "slow-rank-2").glob("*.jsonl")) and stats == []
    report = stragglers.from_records(job, docs, cluster)
    assert [w.worker for w in report.stragglers] == ["2"] and report.workers[0].node == "node-2"
    assert report.workers[0].p50_ms >= 16 and report.workers[0].waited_for_s > 10
    assert report.to_dict()["stragglers"] == ["2"] and "2 reducer record(s)" in report.note


@pytest.mark.parametrize("algo", ["ring", "sharded"])
def test_without_servers_the_rank_that_waited_least_is_the_one_the_others_waited_for(algo):
    job, _ = record(servers=())
    docs = [json.loads(x) for x in (DATA / "collnet-stats" / f"{algo}-slow-rank-2.jsonl").read_text().splitlines()]
    report = stragglers.from_stats(job, [("node-1", d) for d in docs])
    assert report.source == "collnet-stats" and [w.worker for w in report.stragglers] == ["2"]
    assert report.workers[0].worker == "2" and report.workers[0].node == "node-1"
    assert f"no reduction servers: the plugin's own wait per rank ({algo}" in report.note
    shared = stragglers.from_stats(job, [("node-1", docs[0]), ("node-2", docs[0])])   # one home for every node
    assert shared.workers[0].node is None


def test_a_job_without_servers_or_stats_says_why():
    job, _ = record(servers=())
    assert "ran without reduction servers" in stragglers._none_note(job)
    assert "left no lateness record" in stragglers._none_note(record()[0])
