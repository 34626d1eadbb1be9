"""`bench compare`: variants substituted into the command, round-robin runs, medians, ratios, outputs."""

from __future__ import annotations

import pytest

from clustertool.bench import compare
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, MEMBER, SERVER, ClusterRecord, Node

pytestmark = pytest.mark.unit


def _cluster() -> ClusterRecord:
    return ClusterRecord("c", "local", nodes=[Node("node-1", 1, "a", LEADER), Node("node-2", 2, "b", MEMBER),
                                        Node("server-1", 3, "s", SERVER, 0)])


def test_variants_fill_every_placeholder_and_a_command_without_one_is_refused():
    assert compare.variant_argv(["python t.py --allreduce {} --tag x{}"], "servers") == \
        ["python", "t.py", "--allreduce", "servers", "--tag", "xservers"]
    with pytest.raises(UsageError, match="no {} for the variant"):
        compare.variant_argv(["python", "t.py"], "mpi")
    with pytest.raises(UsageError, match="appears twice"):
        compare.parse_variants("mpi,mpi")
    with pytest.raises(UsageError):
        compare.parse_variants("mpi,bad name")


def test_runs_take_turns_on_the_workers_and_report_medians_against_the_first():
    calls = []
    figures = {"mpi": iter([100.0, 120.0, 110.0]), "servers": iter([150.0, 180.0, 160.0])}

    def launch(nodes, per_node, argv):
        calls.append((argv[-1], [n.name for n in nodes], per_node))
        return 0, f"[1,0]<stdout>:samples/sec: {next(figures[argv[-1]])}\n", None

    result = compare.run_compare(_cluster(), ["mpi", "servers"], ["python t.py --allreduce {}"], launch=launch,
                                 repeat=3)
    assert [c[0] for c in calls] == ["mpi", "servers"] * 3
    assert all(c[1] == ["node-1", "node-2"] and c[2] == 1 for c in calls)  # servers are not ranks
    mpi, servers = result.variants
    assert (mpi.throughput, servers.throughput) == (110.0, 160.0)
    assert mpi.ratio == 1.0 and servers.ratio == pytest.approx(160 / 110)
    assert result.ok and compare.rows(result)[1][3] == "1.45x"
    assert "servers,2,2,160.0,1.455" in compare.to_csv(result)


def test_a_failing_variant_is_named_and_the_result_is_not_ok():
    def launch(nodes, per_node, argv):
        if argv[-1] == "servers":
            return 1, "reducer gone", None
        return 0, "samples/sec: 10\n", None

    result = compare.run_compare(_cluster(), ["mpi", "servers"], ["t --a {}"], launch=launch)
    assert not result.ok and result.variants[1].error == "exit 1" and result.variants[1].ratio is None


def test_chart_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    result = compare.run_compare(_cluster(), ["mpi", "servers"], ["t --a {}"],
                                 launch=lambda n, p, a: (0, "samples/sec: 10\n" if a[-1] == "mpi" else
                                                         "samples/sec: 15\n", None))
    path = compare.write_chart(result, tmp_path / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_watch_variants_switch_the_cluster_before_each_run_and_the_command_needs_no_placeholder():
    from clustertool.bench.watchvariants import check

    order = []

    def launch(nodes, per_node, argv):
        order.append(("run", argv[-1]))
        return 0, "[1,0]<stdout>:samples/sec: 100.0\n", None

    result = compare.run_compare(_cluster(), ["off", "record", "monitoring"], ["python", "t.py"], launch=launch,
                                 repeat=2, before=lambda name: order.append(("switch", name)))
    assert order == [step for name in ("off", "record", "monitoring") for step in (("switch", name), ("run", "t.py"))
                     ] * 2
    assert result.ok and [v.argv for v in result.variants] == [["python", "t.py"]] * 3
    check(["off", "monitoring"])
    with pytest.raises(UsageError, match="--watch: variant.s. mpi: expected off, record, monitoring"):
        check(["off", "mpi"])
