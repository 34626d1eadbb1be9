"""The first hour of a new user on a local cluster (issue 33), against real sshd nodes: what each
mistake and each headline example looks like, and that nothing outlives its purpose."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 3, "fh")


def _on_nodes(name, env, line) -> dict[str, str]:
    """{node: its stdout} of ``line`` run on every node."""
    proc = run_cli("exec", "-c", name, "--json", "--", line, env=env)
    return {r["node"]: r["stdout"] for r in json.loads(proc.stdout)["results"]}


def test_exec_timeout_returns_at_the_timeout_and_stops_the_command_on_the_nodes(three):
    name, env = three
    start = time.monotonic()
    proc = run_cli("exec", "-c", name, "--timeout", "2", "--", "sleep 47", env=env)
    took = time.monotonic() - start
    assert proc.returncode == 255, proc.stderr
    assert "node-[1-3] (timed out)" in proc.stdout + proc.stderr
    assert took < 10, f"exec --timeout 2 returned after {took:.1f}s"  # it took 12-17 s (the command: 47 s)
    deadline = time.monotonic() + 15  # the node's own timeout stops it (TERM at 2 s, KILL 2 s later)
    while True:
        running = _on_nodes(name, env, "pgrep -x sleep -a || true")
        left = {node: out for node, out in running.items() if "sleep 47" in out}
        if not left:
            break
        assert time.monotonic() < deadline, f"`sleep 47` still runs on the nodes after exec returned: {left}"
        time.sleep(0.5)
