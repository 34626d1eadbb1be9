"""`clustertool autostop` and `up --autostop` refuse bad requests with one line and a hint, before
looking for a cluster or making anything."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.cli


@pytest.mark.parametrize("args,message", [
    (["autostop", "5m", "--cancel"], "give an idle time or --cancel, not both"),
    (["autostop", "--down"], "--down and --wait-for go with an idle time"),
    (["autostop", "5x"], "invalid idle time '5x'"),
    (["autostop", "5m", "--wait-for", "forever"], "invalid --wait-for 'forever'"),
    (["autostop", "--show", "5m"], "--show only shows"),
    (["up", "-p", "local", "-N", "2", "--name", "x", "--autodown"], "--autodown: needs --autostop"),
    (["up", "-p", "local", "-N", "2", "--name", "x", "--autostop", "soon"], "--autostop: expected an idle time"),
    (["up", "-p", "static", "--name", "x", "--hosts", "a,b", "--autostop", "5m", "--dry-run"],
     "autostop is for machines clustertool made"),
])
def test_bad_autostop_requests_are_one_line_errors(ct_env, args, message):
    proc = run_cli(*args, env=ct_env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_autostop_of_an_unknown_cluster_names_the_known_ones(ct_env):
    proc = run_cli("autostop", "-c", "nope", env=ct_env)
    assert proc.returncode == 1 and "no cluster named 'nope'" in proc.stderr
