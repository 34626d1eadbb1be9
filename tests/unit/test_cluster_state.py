"""A cluster's status is compared with ``ClusterState`` members, never with a string literal.

``ClusterState`` is a ``str`` enum, so ``cluster.status == "ready"`` works and mypy cannot object
to it: a renamed or mistyped state would then fail silently. This walk of the package's source
finds such comparisons on the names that hold a cluster record (``cluster``, ``record``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from clustertool.core.model import ClusterState

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "clustertool"
STATES = {s.value for s in ClusterState}
HOLDERS = ("cluster", "record")  # the names a ClusterRecord goes by here (also as self.record, session.record)


def _holder(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in HOLDERS


def _literals(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in STATES]


def literal_comparisons(label: str, text: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text, label)):
        if not isinstance(node, ast.Compare):
            continue
        if isinstance(node.left, ast.Attribute) and node.left.attr == "status" and _holder(node.left.value):
            found += [f"{label}:{node.lineno}: {value!r}" for c in node.comparators for value in _literals(c)]
    return found


def test_the_finder_finds_literal_states():
    source = ('if cluster.status == "ready": pass\nif self.record.status in ("stopped", "autostopped"): pass\n'
              'if cluster.status == ClusterState.READY: pass\nif outcome.status == "failed": pass\n')
    assert literal_comparisons("fake.py", source) == ["fake.py:1: 'ready'", "fake.py:2: 'stopped'",
                                                      "fake.py:2: 'autostopped'"]


def test_cluster_states_are_compared_as_members():
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in literal_comparisons(str(path.relative_to(PACKAGE.parent)), path.read_text())]
    assert found == [], "compare with ClusterState members:\n" + "\n".join(found)
