"""A local cluster whose state is gone (a killed run, a deleted state file) is found and removed by
its own clustertool home's sweep, with its key and hostfile; another home's clusters on the same
machine (another user, another test run) are listed and left alone."""

import json
import os

import pytest

from clustertool.core import state
from clustertool.providers.local.strays import BridgeOwner, parse_alias
from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local


def _other_home(tmp_path) -> dict:
    return dict(os.environ, CLUSTERTOOL_HOME=str(tmp_path / "other-home"),
                CLUSTERTOOL_HOSTFILE_DIR=str(tmp_path / "other-hf"), CLUSTERTOOL_NO_SSH_INCLUDE="1")


def test_sweep_removes_this_homes_lost_cluster_with_its_files_and_spares_known_ones(ct_env, local_cluster):
    kept = local_cluster(2)
    lost = unique("lost")
    up = run_cli("up", "--provider", "local", "--nodes", "2", "--name", lost, env=ct_env)
    assert up.returncode == 0, up.stderr
    hostfile = os.path.join(ct_env["CLUSTERTOOL_HOSTFILE_DIR"], lost)
    assert os.path.exists(hostfile)
    state.state_path(lost).unlink()  # the state is gone; its namespaces and sshd are not
    assert local_leftovers(lost) != []

    listing = run_cli("down", "--sweep", "--provider", "local", "--json", "--yes", env=ct_env)
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    mine = [o for o in data["orphans"] if o["cluster"] == lost]
    assert len(mine) == 1 and mine[0]["action"] == "delete"
    assert local_leftovers(lost) == []
    assert not os.path.exists(hostfile), "the lost cluster's hostfile goes with it"
    assert not state.cluster_dir(lost).exists(), "and its key and files"
    assert run_cli("exec", "-c", kept, "--", "true", env=ct_env).returncode == 0


def test_sweep_keeps_another_homes_lost_cluster(ct_env, local_cluster, tmp_path):
    other = _other_home(tmp_path)
    theirs = unique("theirs")
    up = run_cli("up", "--provider", "local", "--nodes", "2", "--name", theirs, env=other)
    assert up.returncode == 0, up.stderr
    try:
        os.unlink(os.path.join(other["CLUSTERTOOL_HOME"], "clusters", f"{theirs}.json"))  # lost to its home too
        swept = run_cli("down", "--sweep", "--provider", "local", "--json", "--yes", env=ct_env)
        assert swept.returncode == 0, swept.stderr
        row = [o for o in json.loads(swept.stdout)["orphans"] if o["cluster"] == theirs]
        assert len(row) == 1 and row[0]["action"] == "keep" and "another clustertool home" in row[0]["why"]
        assert local_leftovers(theirs) != [], "this home's sweep never touches another home's cluster"
    finally:
        assert run_cli("down", "--sweep", "--provider", "local", "--yes", env=other).returncode == 0
    assert local_leftovers(theirs) == []


def test_sweep_without_yes_and_without_a_terminal_refuses(ct_env, local_cluster):
    lost = local_cluster(2)
    os.unlink(state.state_path(lost))
    proc = run_cli("down", "--sweep", "--provider", "local", env=ct_env, input="")
    assert proc.returncode != 0 and "--yes" in proc.stderr
    assert local_leftovers(lost) != []
    assert run_cli("down", "--sweep", "--provider", "local", "--yes", env=ct_env).returncode == 0
    assert local_leftovers(lost) == []


@pytest.mark.parametrize("alias,expected", [
    ("clustertool:demo:ab12:h0me:demo-3f9a1c", BridgeOwner("demo", "ab12", "h0me", "demo-3f9a1c")),
    ("clustertool:demo:ab12:h0me:-", BridgeOwner("demo", "ab12", "h0me", None)),
    ("clustertool:demo:ab12", BridgeOwner("demo", "ab12")),  # made before bridges named their home
    ("clustertool:Bad Name:x", None),
    ("something else", None),
    ("clustertool:demo:", None),
    ("clustertool:demo:ab12:h0me", None),
])
def test_bridge_alias_parsing(alias, expected):
    assert parse_alias(alias) == expected
