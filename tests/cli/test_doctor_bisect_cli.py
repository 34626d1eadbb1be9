"""`doctor --bisect` bad input through the real CLI: one clear line, no traceback, decided before any SSH."""

from __future__ import annotations

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import run_cli

pytestmark = pytest.mark.cli


@pytest.fixture
def recorded(ct_env):
    """A recorded, ready cluster whose addresses nothing answers: every case must be decided before SSH."""
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member") for i in range(1, 4)]
    state.save(ClusterRecord(name="rec", provider="local", nodes=nodes, status="ready"))
    return ct_env


@pytest.mark.parametrize("args,needle", [
    (("--bisect", "--threshold", "1.5"), "--threshold 1.5 is not between 0 and 1"),
    (("--check", "network", "--threshold", "0"), "--threshold 0.0 is not between 0 and 1"),
    (("--bisect", "--check", "disk"), "--bisect runs the network search alone"),
    (("--bisect", "--threshold", "fast"), "Invalid value for '--threshold'"),
])
def test_bad_bisect_input_is_one_line(recorded, args, needle):
    proc = run_cli("doctor", *args, env=recorded, timeout=20)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and needle in proc.stderr, proc.stderr
