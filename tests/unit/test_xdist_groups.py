"""`make test`'s parallel workers keep together the tests that share something (tests/xdist_groups.py)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO

pytest.importorskip("xdist", reason="pytest-xdist (the test extra) runs `make test` in parallel workers")

from tests.xdist_groups import group_of, tier_rank  # noqa: E402

pytestmark = pytest.mark.unit


def test_a_module_that_shares_a_cluster_runs_on_one_worker_in_order():
    # test_shared_fs.py's tests use one cluster each after the other (a file written, then read after a stop)
    for test in ("test_it_survives_stop_and_start", "test_doctor_names_a_node_that_lost_the_mount_and_repair_mounts_"
                 "fixes_it"):
        assert group_of(f"tests/local/test_shared_fs.py::{test}") == "tests/local/test_shared_fs.py"
    assert group_of("tests/local/test_launchers.py::test_kill_leaves_nothing_on_any_node[torchrun]") == \
        "tests/local/test_launchers.py"


def test_every_module_cluster_and_module_venv_keeps_its_file_together():
    files = [p for p in (REPO / "tests").rglob("test_*.py")
             if "module_cluster(" in p.read_text() or 'scope="module"' in p.read_text()]
    assert len(files) > 15
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        assert group_of(f"{rel}::test_x") in (rel, "native-build"), rel


def test_tests_with_their_own_cluster_or_none_run_anywhere():
    assert group_of("tests/local/test_copy.py::test_missing_src_is_one_clear_line") is None
    assert group_of("tests/unit/test_imports.py::test_module_names_are_unique") is None
    assert group_of("tests/aws/test_fault_matrix.py::test_sweeps_during_up_touch_nothing_and_down_stops_that_up_"
                    "leaving_nothing") is None


def test_every_make_in_native_runs_on_one_worker():
    assert group_of("tests/native/test_native_make.py::test_sanitizer_build_passes") == "native-build"
    assert group_of("tests/native/test_plugin_allreduce.py::test_x") == "native-build"


def test_slow_tiers_are_handed_out_before_unit_tests():
    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["tests/unit/test_a.py::t", "tests/cli/test_b.py::t", "tests/local/test_c.py::t", "tests/aws/test_d.py::t",
           "tests/native/test_e.py::t"]
    assert [i.nodeid.split("/")[1] for i in sorted(map(Item, ids), key=tier_rank)] == \
        ["native", "local", "aws", "cli", "unit"]
