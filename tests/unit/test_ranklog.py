"""nodeprogs/ranklog.py, the node side of `logs`: rank files in, whole tagged lines out.

The program runs here exactly as on a node (``python3 -`` with its arguments prepended), on
files laid out as Open MPI 4.1's ``--output-filename DIR`` lays them out (``DIR/1/rank.NN/stdout``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clustertool import nodeprogs
from clustertool.nodeprogs import ranklog

pytestmark = pytest.mark.unit


def start(args, **kw):
    return subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def run(args, timeout=30):
    proc = start(args)
    out, err = proc.communicate(nodeprogs.program_text("ranklog", args), timeout=timeout)
    assert proc.returncode == 0, err
    return out.decode().splitlines()


def rank_file(out: Path, rank: int, stream: str = "stdout", width: int = 1) -> Path:
    path = out / "1" / f"rank.{rank:0{width}d}" / stream
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def args_for(out, **kw):
    base = {"out": str(out), "log": None, "ranks": None, "tag": True, "mode": "read", "tail": None,
            "final": True, "end": {}, "keys": False}
    return {**base, **kw}


def test_a_partial_line_is_held_until_its_newline_and_crlf_loses_its_cr():
    src = ranklog.Source("x", (1, 0, 0), b"")
    assert src.take(b"rank 3 on node-2", final=False) == []
    assert src.take(b"\r\nnext", final=False) == [b"rank 3 on node-2"]
    assert src.take(b"", final=True) == [b"next"]


def test_a_line_longer_than_the_limit_is_passed_on_in_pieces(monkeypatch):
    monkeypatch.setattr(ranklog, "MAX_LINE", 10)
    src = ranklog.Source("x", (1, 0, 0), b"")
    assert src.take(b"a" * 25, final=False) == [b"a" * 10, b"a" * 10]
    assert src.take(b"\n", final=False) == [b"a" * 5]


@pytest.mark.parametrize("text,n,expected", [
    (b"1\n2\n3\n", 2, b"2\n3\n"), (b"1\n2\n3", 2, b"2\n3"), (b"1\n2\n", 5, b"1\n2\n"), (b"", 3, b""),
    (b"x\n" * 100000, 1, b"x\n"),
])
def test_tail_offset_starts_at_the_last_n_lines(tmp_path, text, n, expected):
    path = tmp_path / "f"
    path.write_bytes(text)
    assert text[ranklog.tail_offset(str(path), n):] == expected


def test_read_goes_rank_by_rank_then_mpiruns_own_lines(tmp_path):
    out = tmp_path / "out"
    for rank in (11, 2, 0):  # 12 ranks: Open MPI pads the rank to two digits
        rank_file(out, rank, width=2).write_bytes(f"r{rank} a\nr{rank} b\n".encode())
        rank_file(out, rank, "stderr", width=2).write_bytes(f"e{rank}\n".encode())
    (tmp_path / "log").write_text("mpirun: the end\n")
    lines = run(args_for(out, log=str(tmp_path / "log")))
    assert lines == ["[1,0]<stdout>:r0 a", "[1,0]<stdout>:r0 b", "[1,0]<stderr>:e0",
                     "[1,2]<stdout>:r2 a", "[1,2]<stdout>:r2 b", "[1,2]<stderr>:e2",
                     "[1,11]<stdout>:r11 a", "[1,11]<stdout>:r11 b", "[1,11]<stderr>:e11", "mpirun: the end"]
    assert run(args_for(out, ranks=[2], tag=False, tail=1)) == ["r2 b", "e2"]


def test_read_of_a_running_job_holds_the_partial_last_line_and_says_what_it_found(tmp_path):
    out = tmp_path / "out"
    rank_file(out, 0).write_bytes(b"whole\nhalf a li")
    assert run(args_for(out, final=False, keys=True)) == ["found 1", "1 0 0 [1,0]<stdout>:whole"]
    assert run(args_for(out, final=True)) == ["[1,0]<stdout>:whole", "[1,0]<stdout>:half a li"]
    assert run(args_for(tmp_path / "cleaned", keys=True)) == ["found 0"]


def writer(path: Path, rank: int, count: int) -> None:
    """One rank: lines in fragments (as print() with PYTHONUNBUFFERED makes them), some long."""
    with open(path, "ab", buffering=0) as fh:
        for i in range(count):
            body = (f"{rank}:{i}:" * 1500) if i % 40 == 0 else f"line {i} of rank {rank}"
            fh.write(body[:7].encode())
            fh.write(body[7:].encode())
            fh.write(b"\n")


def test_follow_prints_only_whole_tagged_lines_while_ranks_write_fragments(tmp_path):
    out, stop = tmp_path / "out", tmp_path / "follow-x.stop"
    proc = start(None)
    proc.stdin.write(nodeprogs.program_text("ranklog", args_for(out, mode="follow", end={"stop": str(stop)})))
    proc.stdin.close()
    time.sleep(0.3)  # the follower is running before the ranks' files exist
    writers = [threading.Thread(target=writer, args=(rank_file(out, r, "stderr" if r == 3 else "stdout"), r, 400))
               for r in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    with open(rank_file(out, 1), "ab") as fh:
        fh.write(b"no newline at the end")
    stop.touch()
    lines = proc.stdout.read().decode().splitlines()
    assert proc.wait(timeout=10) == 0 and not stop.exists()  # the follower removes its stop file
    expected = {f"[1,{r}]<{'stderr' if r == 3 else 'stdout'}>:" +
                ((f"{r}:{i}:" * 1500) if i % 40 == 0 else f"line {i} of rank {r}")
                for r in range(4) for i in range(400)}
    assert set(lines) - {"[1,1]<stdout>:no newline at the end"} == expected
    assert len(lines) == 4 * 400 + 1  # each once
    assert [ln for ln in lines if ln.startswith("[1,1]")][-1] == "[1,1]<stdout>:no newline at the end"


def test_follow_on_the_leader_ends_with_the_job_and_reads_what_came_before(tmp_path):
    job = tmp_path / "job"
    out = job / "out"
    rank_file(out, 0).write_bytes(b"one\n")
    (job / "log").write_text("")
    sleeper = subprocess.Popen(["sleep", "60"], env=dict(os.environ, CLUSTERTOOL_JOB="jx"))
    (job / "launch.pid").write_text(f"{sleeper.pid} 1 1 1\n")
    end = {"job_dir": str(job), "marker": "CLUSTERTOOL_JOB=jx"}
    proc = start(None)
    proc.stdin.write(nodeprogs.program_text("ranklog", args_for(out, mode="follow", end=end, log=str(job / "log"))))
    proc.stdin.close()
    time.sleep(0.5)
    assert proc.poll() is None  # launch.sh (the sleeper) still runs
    with open(rank_file(out, 0), "ab") as fh:
        fh.write(b"two, unfinished")
    (job / "log").write_text("mpirun: done\n")
    sleeper.kill()
    sleeper.wait()
    lines = proc.stdout.read().decode().splitlines()
    assert proc.wait(timeout=5) == 0
    assert lines == ["[1,0]<stdout>:one", "[1,0]<stdout>:two, unfinished", "mpirun: done"]


def test_a_follower_whose_reader_went_away_ends(tmp_path):
    proc = start(None)
    proc.stdin.write(nodeprogs.program_text("ranklog", args_for(tmp_path, mode="follow",
                                                                end={"stop": str(tmp_path / "never")})))
    proc.stdin.close()
    time.sleep(0.5)
    assert proc.poll() is None
    proc.stdout.close()  # what sshd does when the client is gone
    assert proc.wait(timeout=5) == 0


@pytest.mark.parametrize("text,ranks", [("3", {3}), ("0,2", {0, 2}), ("4-7", {4, 5, 6, 7}), ("1, 3-4", {1, 3, 4}),
                                        (None, None)])
def test_rank_selections_read_as_lists_and_ranges(text, ranks):
    from clustertool.jobs.jobrequests import parse_ranks

    assert parse_ranks(text) == ranks


@pytest.mark.parametrize("text", ["x", "1-", "-2", "1,,2", "a-b"])
def test_a_bad_rank_selection_is_a_usage_error(text):
    from clustertool.core.errors import UsageError
    from clustertool.jobs.jobrequests import parse_ranks

    with pytest.raises(UsageError, match="--rank"):
        parse_ranks(text)
