"""Sessions (remote/session.py): JSON lines both ways with a program on many nodes, ssh swapped for a
local shell (the conversation is under test; sync-s3's local tier runs it over real sshd)."""

import sys
import threading

import pytest

from clustertool.core.model import ClusterRecord, Node
from clustertool.remote.dialog import run_sessions
from clustertool.remote.transport import Link
from tests.fakes.transport import LocalShell

LINK = Link(ClusterRecord("c", "local"), LocalShell())  # the cluster name is all a test shell looks at

pytestmark = pytest.mark.unit

# Asks twice, prints the answers' sum as a plain line, then a final message.
ASKER = (f"{sys.executable} -c 'import json,sys\n"
         "i=sys.stdin.buffer; n=int(i.readline())\n"
         "total=0\n"
         "for q in range(n):\n"
         "    print(json.dumps({\"ask\": q}), flush=True); total += json.loads(i.readline())[\"answer\"]\n"
         "print(\"not json\"); print(json.dumps({\"done\": total}), flush=True)'")


def _nodes(n):
    return [Node(f"node-{i}", i, f"10.0.0.{i}") for i in range(1, n + 1)]


def test_each_node_gets_its_answers_and_its_messages_reach_the_handler():
    got = []

    def on_message(node, msg, reply):
        got.append((node, msg))
        if "ask" in msg:
            reply({"answer": int(node[-1]) * 10 + msg["ask"]})

    result = run_sessions(LINK, _nodes(3), ASKER, opening=lambda n: f"{n.index}\n".encode(),
                          on_message=on_message)
    assert [r.exit_code for r in result.results] == [0, 0, 0]
    done = {node: msg["done"] for node, msg in got if "done" in msg}
    assert done == {"node-1": 10, "node-2": 41, "node-3": 93}  # node-3: 30 + 31 + 32
    assert all(r.stdout == "not json\n" for r in result.results)


def test_a_node_that_never_finishes_is_timed_out_and_the_others_are_not_held_up(tmp_path):
    """The nodes' commands hang until the test opens their gate, which it does only once the call has
    returned: the call came back at the timeout while they were held, not when they ended (no wall-clock
    bound).  A thread opens the gate after 600 s so that a call that waits for them fails instead of hanging."""
    gate = tmp_path / "open"
    safety = threading.Timer(600, gate.touch)
    safety.start()
    try:
        result = run_sessions(LINK, _nodes(2), f"read x; echo '{{\"a\": 1}}'; until [ -e {gate} ]; do sleep 0.05; done",
                              opening=lambda n: b"go\n", on_message=lambda *a: None, timeout=1)
        held = not gate.exists()
    finally:
        safety.cancel()
        gate.touch()
    assert held
    assert [r.error for r in result.results] == ["timed out", "timed out"]


def test_a_failing_handler_stops_that_node_and_says_so():
    def on_message(node, msg, reply):
        if node == "node-2":
            raise RuntimeError("presign failed")
        reply({"answer": 1})

    result = run_sessions(LINK, _nodes(2), ASKER, opening=lambda n: b"1\n", on_message=on_message, timeout=20)
    by = result.by_node()
    assert by["node-1"].ok
    assert not by["node-2"].ok and "presign failed" in by["node-2"].reason
