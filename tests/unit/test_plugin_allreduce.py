"""plugin_allreduce's pure parts: where the plugin library is looked for, bad arguments refused early."""

from __future__ import annotations

import pytest

from clustertool.workloads import plugin_allreduce

pytestmark = pytest.mark.unit


def test_an_explicit_library_path_is_the_only_candidate():
    lib = "/opt/p/libnccl-net-clustertool.so"
    assert plugin_allreduce.library_candidates(lib, env={}) == [lib]


def test_clustertool_plugin_lib_wins_over_the_loader_path():
    env = {"CLUSTERTOOL_PLUGIN_LIB": "/x/lib.so"}
    assert plugin_allreduce.library_candidates(None, env=env) == ["/x/lib.so"]


def test_default_is_the_loader_path_then_this_checkouts_build():
    first, second = plugin_allreduce.library_candidates(None, env={})
    assert first == "libnccl-net-clustertool.so"   # found through LD_LIBRARY_PATH (run --plugin sets it)
    assert second.endswith("native/build/libnccl-net-clustertool.so")


def test_an_unknown_algorithm_is_refused_before_any_library_is_loaded():
    with pytest.raises(plugin_allreduce.PluginAllreduceError, match="unknown plugin algorithm 'tree'"):
        plugin_allreduce.PluginAllreduce(comm=None, algo="tree", library="/nonexistent.so")


def test_a_missing_library_is_one_line_with_the_fix():
    with pytest.raises(plugin_allreduce.PluginAllreduceError, match="make -C native"):
        plugin_allreduce.load_library("/nonexistent/libnccl-net-clustertool.so")


def test_nccl_enum_values_match_the_plugins_abi():
    assert plugin_allreduce.DTYPES["float32"] == 7 and plugin_allreduce.DTYPES["bfloat16"] == 9
    assert plugin_allreduce.OPS["sum"] == 0 and plugin_allreduce.OPS["min"] == 3
