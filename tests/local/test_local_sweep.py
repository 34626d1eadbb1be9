"""A local cluster whose state is gone (a killed run, a deleted home) is found and removed."""

import json
import os

import pytest

from clustertool import state
from clustertool.providers.local.sweep import parse_alias
from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local


def test_sweep_removes_a_cluster_whose_state_was_lost_and_spares_known_ones(ct_env, local_cluster):
    kept = local_cluster(2)
    lost = unique("lost")
    up = run_cli("up", "--provider", "local", "--nodes", "2", "--name", lost, env=ct_env)
    assert up.returncode == 0, up.stderr
    state.state_path(lost).unlink()  # the state is gone; its namespaces and sshd are not
    assert local_leftovers(lost) != []

    listing = run_cli("down", "--sweep", "--provider", "local", "--json", "--yes", env=ct_env)
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert [o["cluster"] for o in data["orphans"]] == [lost]
    assert local_leftovers(lost) == []
    assert run_cli("exec", "-c", kept, "--", "true", env=ct_env).returncode == 0


def test_sweep_without_yes_and_without_a_terminal_refuses(ct_env, local_cluster):
    lost = local_cluster(2)
    os.unlink(state.state_path(lost))
    proc = run_cli("down", "--sweep", "--provider", "local", env=ct_env, input="")
    assert proc.returncode != 0 and "--yes" in proc.stderr
    assert local_leftovers(lost) != []
    assert run_cli("down", "--sweep", "--provider", "local", "--yes", env=ct_env).returncode == 0
    assert local_leftovers(lost) == []


@pytest.mark.parametrize("alias,expected", [
    ("clustertool:demo:ab12", ("demo", "ab12")),
    ("clustertool:Bad Name:x", None),
    ("something else", None),
    ("clustertool:demo:", None),
])
def test_bridge_alias_parsing(alias, expected):
    assert parse_alias(alias) == expected
