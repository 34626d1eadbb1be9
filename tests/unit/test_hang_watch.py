"""The supervisor's hang check (nodeprogs/supervise.py HangWatch): output or real CPU use is progress; the odd
clock tick of a backend's threads waking in a wait is not (on a loaded machine a gloo wait ticked within 20 s
and a hung job was never found).  The nodes' answers are given here; tests/local/test_launchers.py runs it."""

from __future__ import annotations

import json
import os

import pytest

from clustertool.nodeprogs import supervise

pytestmark = pytest.mark.unit
HZ = os.sysconf("SC_CLK_TCK")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def watch(tmp_path, monkeypatch, answers):
    """A HangWatch over 2 nodes x 4 ranks whose probes return ``answers`` (bytes, ticks) in turn, 5 s apart."""
    clock = Clock()
    monkeypatch.setattr(supervise, "time", clock)
    monkeypatch.setattr(supervise.HangWatch, "save_stacks", lambda self: None)
    w = supervise.HangWatch({"job_dir": str(tmp_path), "hang_timeout": 20, "all_nodes": [["node-1", "a"],
                                                                                          ["node-2", "b"]]})
    feed, last = iter(answers), [answers[0]]

    def progress():   # asked again after the stacks are saved: the same answer
        b, c = last[0] = next(feed, last[0])
        return (("node-1", str(b)), ("node-2", "0")), c, 8
    monkeypatch.setattr(w, "progress", progress)
    for _ in answers:
        w.check()
        clock.now += w.poll
    return w


def test_a_wait_whose_threads_tick_now_and_then_is_hung_after_the_timeout(tmp_path, monkeypatch):
    ticks = [(100, 50 + k) for k in range(8)]   # a tick every 5 s among 8 ranks: far under 1% of a core each
    watch(tmp_path, monkeypatch, ticks)
    assert (tmp_path / "hung").exists()
    assert "no rank wrote a line or used over 1% of a core for 20s" in (tmp_path / "log").read_text()


def test_ranks_that_compute_without_writing_are_not_hung(tmp_path, monkeypatch):
    busy = [(100, 50 + k * 8 * 5 * HZ) for k in range(8)]   # 8 ranks, each a whole core
    watch(tmp_path, monkeypatch, busy)
    assert not (tmp_path / "hung").exists()


def test_output_clears_a_hang_already_found(tmp_path, monkeypatch):
    answers = [(100, 50)] * 7 + [(180, 50)]
    w = watch(tmp_path, monkeypatch, answers)
    assert "hung?" in (tmp_path / "log").read_text()   # found after 20 s
    assert not (tmp_path / "hung").exists() and not w.reported   # and taken back


def test_each_look_is_written_down_and_a_failed_look_does_not_end_the_watch(tmp_path, monkeypatch):
    """`hangwatch` says what the last look saw (what a test or a user reads when no hang was found); a look that
    raised (a node's odd answer) is noted there and the watch goes on: the thread once ended silently."""
    w = watch(tmp_path, monkeypatch, [(100, 50), (100, 50)])
    seen = json.loads((tmp_path / "hangwatch").read_text())
    assert seen["saw"].startswith("ranks used 0.00s of CPU (quiet under ") and seen["timeout"] == 20
    looks = iter([ValueError("invalid literal for int()")] + [None] * 6)

    def check():
        bad = next(looks)
        if bad:
            raise bad
        return False
    monkeypatch.setattr(w, "check", check)
    rounds = iter(range(7))
    monkeypatch.setattr(supervise, "running", lambda pid, d: next(rounds, None) is not None)
    supervise.watch_hang(w, 1, str(tmp_path), 1.0)
    assert next(looks, "all looked") == "all looked"   # it went on after the failed look
    assert json.loads((tmp_path / "hangwatch").read_text())["saw"] == ("the look failed: ValueError: invalid "
                                                                      "literal for int()")
