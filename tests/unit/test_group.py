"""Parallel fan-out semantics, with ssh swapped for a local shell (the fan-out is under test,
not ssh: the local tier runs the same code against real sshd)."""

import os
import signal
import threading

import pytest

from clustertool.core.model import ClusterRecord, Node
from clustertool.remote import group
from clustertool.remote.transport import Link
from tests.fakes.transport import LocalShell

pytestmark = pytest.mark.unit


SHELL = LocalShell()
LINK = Link(ClusterRecord("c", "local"), SHELL)  # the cluster name is all a test shell looks at


def _nodes(n):
    return [Node(f"node-{i}", i, f"10.0.0.{i}") for i in range(1, n + 1)]


def test_exit_code_is_the_highest_and_each_node_has_a_result():
    result = group.run_on_nodes(LINK, _nodes(3), lambda n: f"exit {n.index}")
    assert [r.exit_code for r in result.results] == [1, 2, 3]
    assert result.exit_code == 3


def test_a_hung_node_is_reported_and_does_not_stall_the_others(tmp_path):
    """node-2 hangs until the test opens its gate, which the test does only once the call has returned: the call
    came back while node-2's command was still held (the others done), not after it (no wall-clock bound).
    A thread opens the gate after 600 s so that a call that waits for node-2 fails instead of hanging."""
    gate = tmp_path / "open"
    hold = f"until [ -e {gate} ]; do sleep 0.05; done; echo released"
    safety = threading.Timer(600, gate.touch)
    safety.start()
    try:
        result = group.run_on_nodes(LINK, _nodes(3), lambda n: hold if n.index == 2 else "echo ok", timeout=1)
        held = not gate.exists()
    finally:
        safety.cancel()
        gate.touch()  # the orphaned shell of node-2 (sh -c stands in for ssh) may end now
    by = result.by_node()
    assert held and by["node-2"].error == "timed out" and by["node-2"].effective_code == 255
    assert "released" not in by["node-2"].stdout
    assert by["node-1"].stdout == "ok\n" and by["node-3"].ok
    assert result.exit_code == 255


def test_runs_in_parallel_not_in_sequence(tmp_path):
    """Every node's command waits until all 8 have started (a barrier): run one after another, the first
    would wait alone and give up (exit 3) after about 60 s; run at once, all pass it.  No wall-clock bound."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    wait_all = ("touch {d}/{i}; k=0; until [ $(ls {d} | wc -l) -ge 8 ]; do k=$((k+1)); [ $k -gt 1200 ] && exit 3; "
                "sleep 0.05; done")
    result = group.run_on_nodes(LINK, _nodes(8), lambda n: wait_all.format(d=barrier, i=n.index))
    assert [r.exit_code for r in result.results] == [0] * 8, [(r.node, r.exit_code, r.error) for r in result.results]


def test_lines_stream_to_the_callback_with_the_node_name():
    seen = []
    group.run_on_nodes(LINK, _nodes(2), "echo out; echo err >&2", on_line=lambda *a: seen.append(a))
    assert ("node-1", "stdout", "out") in seen and ("node-2", "stderr", "err") in seen


def test_stdin_can_differ_per_node():
    result = group.run_on_nodes(LINK, _nodes(2), "cat", stdin_data=lambda n: n.name.encode())
    assert [r.stdout for r in result.results] == ["node-1", "node-2"]


def test_a_timed_out_node_whose_output_stays_open_returns_at_the_deadline(tmp_path, monkeypatch):
    """A command that times out while something it started elsewhere keeps its output open (as a command left
    running on a node holds a ControlMaster's session open): the call ends at the timeout, not when the output
    closes (it returned 5 s per open stream later).  The holders keep the output open until the test opens
    their gate, which it does only once the call has returned, and the output grace is made longer than the
    test's 600 s safety: a call that waited for the held output would come back only after the gate opened.
    No wall-clock bound."""
    monkeypatch.setattr(group, "OUTPUT_GRACE_S", 3600.0)
    gate, pids = tmp_path / "open", tmp_path / "pids"
    wait = f"until [ -e {gate} ]; do sleep 0.05; done"
    holder = f"setsid sh -c 'echo $$ >> {pids}; {wait}' & {wait}"
    safety = threading.Timer(600, gate.touch)
    safety.start()
    try:
        # 3 s: time for the holders to start (asserted below); the timeout is not what is measured
        result = group.run_on_nodes(LINK, _nodes(2), holder, timeout=3)
        held = not gate.exists()
        holders = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
        alive = [pid for pid in holders if _alive(pid)]
    finally:
        safety.cancel()
        gate.touch()
        for pid in pids.read_text().split() if pids.exists() else []:
            _kill(int(pid))
    assert [r.error for r in result.results] == ["timed out", "timed out"]
    # both holders had started and still held the output open when the call came back
    assert held and len(holders) == 2 and alive == holders, (held, holders, alive)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
