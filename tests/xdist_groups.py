"""Which tests must share a pytest-xdist worker (`make test` runs the suite in several).

A test may run on any worker unless it shares something with other tests:

- a fixture wider than one test (a module's cluster, a module's bare virtualenv): its file's tests
  run on one worker, one after another, so the module makes that cluster once and its tests see it as
  they would in one process;
- native/'s build folder: the tests that run `make` there run on one worker, one make at a time.

The controller decides from test ids alone (it collects nothing itself), so a file counts as sharing
when its source declares a fixture of class, module or package scope. xdist's own ``xdist_group``
marks are not used: pytest-xdist 3.8 writes the group into an attribute pytest 9.2 no longer reads.
Groups go out first, largest first (xdist's loadscope order), then single tests in collection order,
which workers sort by tier (:func:`tier_rank`): the long local and aws tests start early and unit
tests fill the gaps at the end.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parent.parent
NATIVE_BUILDERS = {"tests/native/test_native_make.py", "tests/native/test_plugin_allreduce.py"}
TIERS = ("native", "local", "install", "aws", "cli", "unit")
_WIDE_FIXTURE = re.compile(r"""scope\s*=\s*["'](class|module|package)["']""")


@functools.lru_cache(maxsize=None)
def shares_a_fixture(path: str) -> bool:
    """Whether the test file at ``path`` (relative to the checkout) declares a fixture wider than a test."""
    try:
        return bool(_WIDE_FIXTURE.search((ROOT / path).read_text(errors="replace")))
    except OSError:
        return False


def group_of(nodeid: str) -> str | None:
    """The name of the worker-sharing group of a test, or None when it may run anywhere."""
    path = nodeid.split("::", 1)[0]
    if path in NATIVE_BUILDERS:
        return "native-build"
    return path if shares_a_fixture(path) else None


def tier_rank(item) -> int:
    parts = item.nodeid.split("::", 1)[0].split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return TIERS.index(tier) if tier in TIERS else len(TIERS)


class SharedFixtureScheduling(LoadScopeScheduling):
    """xdist's loadscope scheduling with our scopes: a group (see :func:`group_of`), else the test itself."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid
