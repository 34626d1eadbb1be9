"""bench allreduce: sizes and algorithms parse, the bench argv, rows from real-looking output,
the side-by-side view and the tuner table it writes."""

from __future__ import annotations

import pytest

from clustertool.bench import allreduce
from clustertool.core.errors import UsageError

pytestmark = pytest.mark.unit

OUTPUT = """\
[1,0]<stdout>:# collnet_bench: 4 ranks, plugin /root/.clustertool/lib/libnccl-net-clustertool.so
[1,0]<stdout>:#       size         count      type   redop      algo        time     algbw     busbw  #wrong
[1,0]<stdout>:     1048576        262144     float     sum   sharded     65713.7    0.0160    0.0239       0
[1,0]<stdout>:    67108864      16777216     float     sum   sharded   4548460.6    0.0148    0.0221       0
[1,0]<stdout>:     1048576        262144     float     sum      ring     65853.4    0.0159    0.0239       0
[1,0]<stdout>:    67108864      16777216     float     sum      ring   4335812.8    0.0155    0.0232       2
     1048576        262144     float     sum       mpi     60000.0    0.0175    0.0262       0
    67108864      16777216     float     sum       mpi   8463100.0    0.0079    0.0119       0
# Avg bus bandwidth    : 0.0218
"""


def test_parse_sizes_accepts_ranges_and_single_sizes():
    assert allreduce.parse_sizes("1M:256M") == (1 << 20, 256 << 20)
    assert allreduce.parse_sizes("64K") == (65536, 65536)
    assert allreduce.parse_sizes("1000:2KiB") == (1000, 2048)


@pytest.mark.parametrize("bad", ["", "1X", "8M:1M", "0:1M", "abc"])
def test_parse_sizes_rejects_garbage(bad):
    with pytest.raises(UsageError):
        allreduce.parse_sizes(bad)


def test_parse_algos_names_the_unknown_one():
    assert allreduce.parse_algos("sharded, mpi") == ["sharded", "mpi"]
    with pytest.raises(UsageError, match="tree"):
        allreduce.parse_algos("ring,tree")


def test_bench_argv_carries_every_flag():
    argv = allreduce.bench_argv("/opt/x/collnet_bench", (1024, 4096), ["sharded", "mpi"], dtype="bfloat16", iters=3)
    assert argv == ["/opt/x/collnet_bench", "-b", "1024", "-e", "4096", "-f", "2", "-n", "3", "-w", "1",
                    "-c", "1", "-d", "bfloat16", "-o", "sum", "-a", "sharded,mpi", "-r", "262144", "-q", "8"]
    with pytest.raises(UsageError):
        allreduce.bench_argv("b", (1, 2), ["ring"], dtype="complex")


def test_bench_argv_streams_requests_like_nccl_unless_one_request():
    """The default is NCCL's CollNet shape (256 KiB requests, 8 outstanding); the old form,
    one request per allreduce, stays available."""
    stream = allreduce.bench_argv("b", (1, 2), ["ring"], request=64 << 10, depth=16)
    assert stream[-4:] == ["-r", "65536", "-q", "16"]
    one = allreduce.bench_argv("b", (1, 2), ["ring"], one_request=True)
    assert "-r" not in one and "-q" not in one and one[-2:] == ["-a", "ring"]
    for bad in ({"request": 0}, {"depth": 0}, {"depth": 2000}):
        with pytest.raises(UsageError, match="--request"):
            allreduce.bench_argv("b", (1, 2), ["ring"], **bad)


def test_parse_rows_reads_tagged_and_plain_lines():
    rows = allreduce.parse_rows(OUTPUT)
    assert [(r.size, r.algo) for r in rows] == [(1048576, "sharded"), (67108864, "sharded"), (1048576, "ring"),
                                               (67108864, "ring"), (1048576, "mpi"), (67108864, "mpi")]
    assert rows[3].wrong == 2 and rows[1].busbw == pytest.approx(0.0221)


def test_side_by_side_shows_plugin_over_mpi():
    rows = allreduce.parse_rows(OUTPUT)
    assert allreduce.side_by_side_columns(rows) == ["size", "sharded busbw", "ring busbw", "mpi busbw", "plugin/mpi"]
    lines = allreduce.side_by_side(rows)
    assert lines[1] == ["64M", "0.0221", "0.0232", "0.0119", "1.95x"]


@pytest.mark.parametrize("n,text", [(65536, "64K"), (1 << 20, "1M"), (256 << 20, "256M"), (2 << 30, "2G"),
                                    (1536, "1536"), (1000, "1000"), (3 << 20, "3M")])
def test_sizes_read_as_people_write_them(n, text):
    assert allreduce.size_text(n) == text


def test_tuner_csv_picks_collnet_only_where_the_plugin_won():
    text = allreduce.tuner_table(allreduce.parse_rows(OUTPUT), nodes=4)
    lines = text.strip().splitlines()
    assert lines[0].startswith("collective,min_bytes")
    assert lines[1] == "allreduce,0,67108863,ring,simple,-1,4,-1"
    assert lines[2] == f"allreduce,67108864,{1 << 40},collnet_direct,simple,-1,4,-1"


# ---- Cluster.bench_allreduce: the command's work in the core, the API's verb ----------------------------

@pytest.fixture
def bench_cluster(ct_env, monkeypatch):
    """Cluster b (4 nodes, node-4 cordoned, 200mbit links) with the plugin deployed; its launches scripted:
    each returns collnet_bench's OUTPUT and keeps what it was asked (nodes, ranks per node, argv, env)."""
    from clustertool.core import state
    from clustertool.plugin.build import save_record
    from tests.fakes.cluster import saved_cluster

    record = saved_cluster("b", 4, provider="local")  # the local provider shapes links to link_rate
    record.options["link_rate"] = "200mbit"
    record.node("node-4").cordon = {"reason": "flaky"}
    state.save(record)
    save_record("b", {"deployed": {"dest": "/opt/ct/lib/", "sha256": "0" * 64, "version": "0.1.0"}})
    asked: dict = {}

    def launcher(session, **kw):
        asked.update(kw, session=session)

        def launch(nodes, per_node, argv):
            asked.update(nodes=[n.name for n in nodes], per_node=per_node, argv=argv)
            return asked.get("code", 0), OUTPUT, asked.get("error")
        return launch
    monkeypatch.setattr("clustertool.bench.allreducerun.launcher", launcher)
    return asked


def test_bench_allreduce_runs_collnet_bench_on_every_worker_and_writes_the_tuner_table(bench_cluster, tmp_path):
    from clustertool import Cluster

    seen: list = []
    result = Cluster.load("b").bench_allreduce(sizes="1M:64M", algo="sharded,ring,mpi", iters=3, ifname="eth1",
                                               env=["A=1"], tuner_csv=tmp_path / "t" / "tuner.csv", on_line=seen.append)
    asked = bench_cluster
    assert asked["nodes"] == ["node-1", "node-2", "node-3"] and asked["per_node"] == 1  # not the cordoned node
    assert asked["argv"][:3] == ["/opt/ct/lib/collnet_bench", "-b", str(1 << 20)]
    argv = asked["argv"]
    assert argv[argv.index("-n") + 1] == "3" and argv[argv.index("-a") + 1] == "sharded,ring,mpi"
    assert argv[-4:] == ["-r", str(256 << 10), "-q", "8"]   # NCCL's request stream by default
    assert asked["env"] == ["CLUSTERTOOL_SOCKET_IFNAME=eth1", "A=1"] and asked["plugin"] is False
    assert asked["on_line"] == seen.append and asked["session"].name == "b"
    assert (result.ranks, result.servers, len(result.rows)) == (3, None, 6)
    assert result.failure is None and result.wrong and not result.ok  # a ring row has #wrong 2
    assert result.link_line.startswith("busbw/B at 64M (B = link rate, 200 Mbit/s): sharded 0.88")
    assert (tmp_path / "t" / "tuner.csv").read_text() == allreduce.tuner_table(result.rows, 3)
    assert result.tuner_csv == str(tmp_path / "t" / "tuner.csv")
    assert result.to_dict()["rows"][0] == {"size": 1048576, "count": 262144, "dtype": "float", "redop": "sum",
                                           "algo": "sharded", "time_us": 65713.7, "algbw": 0.016, "busbw": 0.0239,
                                           "wrong": 0}


def test_bench_allreduce_failures_are_values_and_a_cluster_that_cannot_run_it_refuses(bench_cluster):
    from clustertool import Cluster
    from clustertool.core.errors import ToolError
    from clustertool.plugin.build import save_record

    bench_cluster.update(code=137, error="timed out after 60s (job j1 killed)")
    result = Cluster.load("b").bench_allreduce(sizes="64K")
    assert result.failure == "allreduce benchmark failed: timed out after 60s (job j1 killed)" and not result.ok
    assert result.to_dict()["exit_code"] == 137 and len(result.rows) == 6  # the rows that came are kept
    bench_cluster.update(code=3, error=None)
    assert Cluster.load("b").bench_allreduce().failure == "allreduce benchmark failed: mpirun exit 3"
    with pytest.raises(UsageError, match="--algo servers: cluster 'b' has no reduction servers"):
        Cluster.load("b").bench_allreduce(algo="servers")
    save_record("b", {})
    with pytest.raises(ToolError, match="the plugin is not deployed on 'b'"):
        Cluster.load("b").bench_allreduce()
