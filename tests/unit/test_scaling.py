"""bench scaling: throughput parsed from real-looking outputs, efficiency math, mpirun argv, outputs."""

from __future__ import annotations

import json

import pytest

from clustertool.bench import scaling
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node

pytestmark = pytest.mark.unit


def value(text: str, **kw):
    metric = scaling.parse_throughput(text, **kw)
    return None if metric is None else metric.value


def test_our_workload_line():
    assert value("ranks: 4\nstep: 180.0 ms\nsamples/sec: 5623.4\n") == 5623.4


def test_last_figure_wins_over_earlier_progress_lines():
    out = "epoch 1 samples/sec: 100.0\nepoch 2 samples/sec: 120.5\nepoch 3 samples/sec: 121.0\n"
    metric = scaling.parse_throughput(out)
    assert metric.value == 121.0 and metric.how == "last figure"


def test_tf_cnn_benchmarks_total_line_wins_over_step_lines():
    out = ("Step\tImg/sec\ttotal_loss\n"
           "1\timages/sec: 245.1 +/- 0.0 (jitter = 0.0)\t7.890\n"
           "100\timages/sec: 246.3 +/- 0.4 (jitter = 1.1)\t7.812\n"
           "----------------------------------------------------------------\n"
           "total images/sec: 1962.40\n")
    metric = scaling.parse_throughput(out)
    assert metric.value == 1962.40 and metric.how == "last 'total' line"


def test_horovod_synthetic_benchmark_total_over_per_gpu():
    out = ("Iter #9: 121.3 img/sec per GPU\n"
           "Img/sec per GPU: 120.5 +-2.0\n"
           "Total img/sec on 16 GPU(s): 1928.0 +-32.0\n")
    assert value(out) == 1928.0


def test_only_per_device_figures_are_multiplied_by_ranks():
    metric = scaling.parse_throughput("Img/sec per GPU: 120.5 +-2.0\n", ranks=8)
    assert metric.value == pytest.approx(964.0)
    assert "x 8 ranks" in metric.how


def test_rank_tagged_lines_are_summed_per_rank_last_value():
    out = ("[1,0]<stdout>:samples/sec: 90.0\n"
           "[1,1]<stdout>:samples/sec: 95.0\n"
           "[1,0]<stdout>:samples/sec: 100.0\n"
           "[1,1]<stdout>:samples/sec: 110.0\n"
           "[1,2]<stdout>:samples/sec: 105.5\n")
    metric = scaling.parse_throughput(out)
    assert metric.value == pytest.approx(315.5)
    assert metric.how == "sum over 3 rank-tagged outputs"


def test_number_before_unit_and_thousands_separators():
    assert value("throughput: 1,234.5 samples/sec\n") == 1234.5
    assert value("processed 3.2e4 tokens/s\n") == 32000.0


def test_no_figure_is_none():
    assert value("loss: 0.3\nall done\n") is None
    assert value("") is None


def test_custom_regex_with_a_group():
    out = "rate=10.5 items\nrate=12.25 items\n"
    assert value(out, regex=r"rate=([0-9.]+)") == 12.25


def test_custom_regex_must_compile_and_have_a_group():
    with pytest.raises(UsageError, match="needs a group"):
        scaling.parse_throughput("x", regex=r"rate=[0-9.]+")
    with pytest.raises(UsageError, match="not a valid regular expression"):
        scaling.parse_throughput("x", regex=r"rate=([0-9.]+")


def test_efficiency_against_the_smallest_size():
    points = [scaling.Point(1, 8, 100.0), scaling.Point(4, 32, 380.0), scaling.Point(32, 256, 2800.0)]
    scaling.add_efficiency(points)
    assert [p.speedup for p in points] == pytest.approx([1.0, 3.8, 28.0])
    assert [p.efficiency for p in points] == pytest.approx([1.0, 0.95, 0.875])


def test_failed_smallest_size_makes_the_next_one_the_base():
    points = [scaling.Point(1, 1, None, error="exit 1"), scaling.Point(2, 2, 200.0), scaling.Point(4, 4, 360.0)]
    scaling.add_efficiency(points)
    assert points[0].speedup is None and points[1].efficiency == 1.0
    assert points[2].speedup == pytest.approx(1.8) and points[2].efficiency == pytest.approx(0.9)


@pytest.mark.parametrize("text", ["", "1,,2", "0,2", "a", "2,2", "-1"])
def test_bad_sizes(text):
    with pytest.raises(UsageError):
        scaling.parse_sizes(text)


def test_sizes_sorted():
    assert scaling.parse_sizes("4, 1,2") == [1, 2, 4]


def test_job_argv_splits_one_string_and_keeps_several():
    assert scaling.job_argv(["python t.py --name 'a b'"]) == ["python", "t.py", "--name", "a b"]
    assert scaling.job_argv(["python", "t.py;rm"]) == ["python", "t.py;rm"]
    with pytest.raises(UsageError):
        scaling.job_argv([])


def _cluster(n: int) -> ClusterRecord:
    nodes = [Node(f"node-{i}", i, f"10.213.9.{i}", role=LEADER if i == 1 else "member", slots=2)
             for i in range(1, n + 1)]
    return ClusterRecord("sc", "local", nodes=nodes)


def test_run_scaling_with_a_fake_launcher(tmp_path):
    calls = []

    def launch(nodes, per_node, argv):
        calls.append(([n.name for n in nodes], per_node))
        if len(nodes) == 2:
            return 1, "mpirun: a rank died\n", None
        return 0, f"samples/sec: {100.0 * len(nodes) * per_node * 0.9 ** len(nodes)}\n", None

    report = scaling.run_scaling(_cluster(4), [1, 2, 4], None, ["python t.py"], launch=launch, log_dir=tmp_path)
    assert calls == [(["node-1"], 2), (["node-1", "node-2"], 2), (["node-1", "node-2", "node-3", "node-4"], 2)]
    assert [p.ranks for p in report.points] == [2, 4, 8]
    assert report.points[1].error == "exit 1" and not report.ok
    assert report.points[2].efficiency == pytest.approx(0.9 ** 4 / 0.9)
    assert (tmp_path / "scaling-2nodes.log").read_text() == "mpirun: a rank died\n"
    rows = scaling.rows(report)
    assert rows[0][:5] == ["1", "2", "180.0", "1.00", "100%"] and rows[1][-1] == "exit 1"
    csv_lines = scaling.to_csv(report).splitlines()
    assert csv_lines[0] == "nodes,ranks,throughput,speedup,efficiency,seconds,exit_code,error"
    assert len(csv_lines) == 4
    data = json.loads(scaling.to_json(report))
    assert data["points"][2]["nodes"] == 4 and data["command"] == "python t.py"


def test_run_scaling_refuses_more_nodes_than_the_cluster_has():
    with pytest.raises(UsageError, match="asks for 8 nodes"):
        scaling.run_scaling(_cluster(4), [1, 8], 1, ["t"], launch=lambda *a: (0, "", None))


def test_output_without_a_figure_is_a_failed_point():
    report = scaling.run_scaling(_cluster(1), [1], 1, ["t"], launch=lambda *a: (0, "done\n", None))
    assert report.points[0].error == "no throughput figure in the output"


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib (the train extra)")
    from clustertool.bench.chart import short_command, write_chart

    report = scaling.ScalingResult("sc", "python /x/train_mlp.py --steps 5",
                            scaling.add_efficiency([scaling.Point(1, 1, 100.0), scaling.Point(2, 2, 190.0)]))
    path = write_chart(report, tmp_path / "c" / "s.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert short_command(report.command) == "train_mlp.py --steps 5"


def test_chart_of_a_zero_baseline_leaves_efficiency_out(tmp_path):
    """The smallest size measured 0/s: efficiency is undefined (None), the chart still draws."""
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib (the train extra)")
    from clustertool.bench.chart import write_chart

    points = scaling.add_efficiency([scaling.Point(1, 1, 0.0), scaling.Point(2, 2, 190.0)])
    assert [p.efficiency for p in points] == [None, None]
    path = write_chart(scaling.ScalingResult("sc", "t", points), tmp_path / "z.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeat_runs_sizes_round_robin_and_takes_the_median(tmp_path):
    calls, figures = [], iter([100.0, 150.0, 90.0, 210.0, 110.0, 180.0])

    def launch(nodes, per_node, argv):
        calls.append(len(nodes))
        return 0, f"samples/sec: {next(figures)}\n", None

    report = scaling.run_scaling(_cluster(2), [1, 2], 1, ["t"], launch=launch, repeat=3, log_dir=tmp_path)
    assert calls == [1, 2, 1, 2, 1, 2]
    assert [p.runs for p in report.points] == [[100.0, 90.0, 110.0], [150.0, 210.0, 180.0]]
    assert [p.throughput for p in report.points] == [100.0, 180.0]
    assert report.points[1].efficiency == pytest.approx(0.9)
    assert sorted(f.name for f in tmp_path.iterdir())[:2] == ["scaling-1nodes.1.log", "scaling-1nodes.2.log"]


def test_repeat_must_be_positive():
    with pytest.raises(UsageError, match="--repeat"):
        scaling.run_scaling(_cluster(1), [1], 1, ["t"], launch=lambda *a: (0, "", None), repeat=0)
