"""State files: atomic, locked, and a clear message for unknown clusters."""

import json
import multiprocessing
import os

import pytest

from clustertool.core import state
from clustertool.core.errors import StateError, UsageError
from clustertool.core.model import ClusterRecord, Node

pytestmark = pytest.mark.unit


def _cluster(name="alpha", n=2):
    return ClusterRecord(name=name, provider="local",
                   nodes=[Node(f"node-{i}", i, f"10.0.0.{i}", role="leader" if i == 1 else "member")
                          for i in range(1, n + 1)])


def test_save_then_load_round_trips_nodes_and_roles(ct_env):
    state.save(_cluster())
    loaded = state.load("alpha")
    assert [n.name for n in loaded.nodes] == ["node-1", "node-2"]
    assert loaded.leader.name == "node-1"


def test_save_leaves_no_temp_files_and_valid_json(ct_env):
    path = state.save(_cluster())
    assert json.loads(path.read_text())["name"] == "alpha"
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_unknown_cluster_names_known_ones(ct_env):
    state.save(_cluster("alpha"))
    with pytest.raises(StateError) as err:
        state.load("beta")
    assert "beta" in err.value.message and "alpha" in err.value.hint


def test_only_cluster_is_the_default_and_several_need_a_name(ct_env):
    state.save(_cluster("alpha"))
    assert state.resolve_name(None) == "alpha"
    state.save(_cluster("beta"))
    with pytest.raises(UsageError) as err:
        state.resolve_name(None)
    assert err.value.message == "several clusters known (alpha, beta): say which one"
    assert err.value.hint == "add -c alpha or -c beta"


def test_many_clusters_known_hint_a_few_and_ls(ct_env):
    for name in ("a1", "a2", "a3", "a4", "a5", "a6"):
        state.save(_cluster(name))
    with pytest.raises(UsageError) as err:
        state.resolve_name(None)
    assert err.value.hint == "add -c NAME: -c a1, -c a2, -c a3, -c a4 ... (`clustertool ls` lists all 6)"


@pytest.mark.parametrize("bad", ["", "Upper", "has space", "a;rm -rf", "x" * 40, "-lead"])
def test_invalid_cluster_names_are_refused(bad):
    with pytest.raises(UsageError):
        state.validate_name(bad)


def _hold_lock(home, ready, release):
    os.environ["CLUSTERTOOL_HOME"] = home
    with state.locked("alpha"):
        ready.set()
        release.wait(10)


def test_lock_excludes_a_second_writer(ct_env):
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    proc = multiprocessing.Process(target=_hold_lock, args=(os.environ["CLUSTERTOOL_HOME"], ready, release))
    proc.start()
    try:
        assert ready.wait(10)
        with pytest.raises(StateError, match="busy"):
            with state.locked("alpha", timeout=0.3):
                pass
    finally:
        release.set()
        proc.join(10)
    with state.locked("alpha", timeout=1):
        pass


def test_delete_forgets_everything(ct_env):
    state.save(_cluster())
    state.cluster_dir("alpha").mkdir(parents=True)
    state.delete("alpha")
    assert not state.exists("alpha") and not state.cluster_dir("alpha").exists()
