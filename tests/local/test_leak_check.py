"""The suite's leak check counts what this test run made, and nothing of anyone else's.

Real namespaces (root): one named like this run's clusters, one like another run's; only the
first is a leak of this run.  Both are removed at the end.
"""

from __future__ import annotations

import secrets
import subprocess

from tests.conftest import SESSION, our_footprint, ours, unique


def test_names_of_this_run_are_told_from_everyone_elses():
    mine = unique("lc")
    other = f"lc-{secrets.token_hex(3)}{secrets.token_hex(2)}"
    assert ours(mine) and not ours("lc-" + mine) and not ours("demo")
    assert ours(other) == other.startswith(f"lc-{SESSION}")


def test_the_footprint_lists_this_runs_namespaces_only():
    mine, theirs = f"ct-{unique('lk')}-1", f"ct-lk-{secrets.token_hex(3)}beef-1"
    made = []
    try:
        for name in (mine, theirs):
            subprocess.run(["ip", "netns", "add", name], check=True)
            made.append(name)
        left = our_footprint()
        assert f"netns {mine}" in left and f"netns {theirs}" not in left
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False)
    assert f"netns {mine}" not in our_footprint()
