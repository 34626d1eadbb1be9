"""plugin_allreduce's pure parts: where the plugin library is looked for, bad arguments refused early."""

from __future__ import annotations

import pytest

from clustertool.workloads import plugin_allreduce as pa

pytestmark = pytest.mark.unit


def test_an_explicit_library_path_is_the_only_candidate():
    assert pa.library_candidates("/opt/p/libnccl-net-clustertool.so", env={}) == ["/opt/p/libnccl-net-clustertool.so"]


def test_clustertool_plugin_lib_wins_over_the_loader_path():
    env = {"CLUSTERTOOL_PLUGIN_LIB": "/x/lib.so"}
    assert pa.library_candidates(None, env=env) == ["/x/lib.so"]


def test_default_is_the_loader_path_then_this_checkouts_build():
    first, second = pa.library_candidates(None, env={})
    assert first == "libnccl-net-clustertool.so"   # found through LD_LIBRARY_PATH (run --plugin sets it)
    assert second.endswith("native/build/libnccl-net-clustertool.so")


def test_an_unknown_algorithm_is_refused_before_any_library_is_loaded():
    with pytest.raises(pa.PluginAllreduceError, match="unknown plugin algorithm 'tree'"):
        pa.PluginAllreduce(comm=None, algo="tree", library="/nonexistent.so")


def test_a_missing_library_is_one_line_with_the_fix():
    with pytest.raises(pa.PluginAllreduceError, match="make -C native"):
        pa.load_library("/nonexistent/libnccl-net-clustertool.so")


def test_nccl_enum_values_match_the_plugins_abi():
    assert pa.DTYPES["float32"] == 7 and pa.DTYPES["bfloat16"] == 9 and pa.OPS["sum"] == 0 and pa.OPS["min"] == 3
