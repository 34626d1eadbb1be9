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
