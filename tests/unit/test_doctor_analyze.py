"""doctor's pure analyzers: facts and measurements in, findings out."""

from __future__ import annotations

import pytest

from clustertool.cluster.facts import Disk, NodeFacts, Proc
from clustertool.doctor import analyze
from clustertool.doctor.findings import CheckResult, Diagnosis, Finding

pytestmark = pytest.mark.unit

GIB = 1024 * 1024  # in KiB


def facts(node, **values):
    return NodeFacts(node, values=dict(values))


def test_disk_full_is_error_low_is_warning_roomy_is_nothing():
    f1 = NodeFacts("node-1", disks=[Disk("/root", 100 * GIB, 50 * GIB, "/")])
    f2 = NodeFacts("node-2", disks=[Disk("/scratch", 1024, 0, "/scratch")])
    f3 = NodeFacts("node-3", disks=[Disk("/root", 100 * GIB, 10 * GIB, "/")])
    found = analyze.disk_findings([f1, f2, f3])
    assert [(f.node, f.severity) for f in found] == [("node-2", "error"), ("node-3", "warning")]
    assert "/scratch: 0 MiB free of 1 MiB (0%) on /scratch" == found[0].message
    assert found[0].fixable


def test_disk_paths_on_one_filesystem_are_reported_once():
    f = NodeFacts("node-1", disks=[Disk("/root", 100 * GIB, 1 * GIB // 4, "/"),
                                   Disk("/root/.clustertool/jobs", 100 * GIB, 1 * GIB // 4, "/")])
    found = analyze.disk_findings([f])
    assert len(found) == 1 and found[0].message.startswith("/root, /root/.clustertool/jobs:")


def test_sameness_names_the_odd_node_out_for_each_key():
    fs = [facts("node-1", nproc="8", mpi="Open MPI 4.1.4", plugin="aa"),
          facts("node-2", nproc="8", mpi="Open MPI 4.1.4", plugin="aa"),
          facts("node-3", nproc="4", mpi="Open MPI 4.1.4", plugin="bb")]
    found = analyze.sameness_findings(fs, {})
    assert [(f.node, f.data["key"], f.severity) for f in found] == [
        ("node-3", "nproc", "warning"), ("node-3", "plugin", "error")]
    assert "plugin checksum is bb here, aa on the other nodes" in found[1].message


def test_sameness_all_equal_or_absent_plugin_is_clean():
    fs = [facts(f"node-{i}", nproc="2", plugin="absent", gpus="none") for i in (1, 2, 3)]
    assert analyze.sameness_findings(fs, {"node-1": 1}) == []


def test_gpu_count_must_match_slots():
    fs = [facts("node-1", gpus="8"), facts("node-2", gpus="8")]
    found = analyze.sameness_findings(fs, {"node-1": 8, "node-2": 4})
    assert [(f.node, f.message) for f in found] == [("node-2", "8 GPU(s) but 4 slot(s) in the hostfile")]


def test_strays_are_processes_outside_running_jobs():
    f = NodeFacts("node-2", procs=[Proc(10, "python3", None, "python3 x.py"),
                                   Proc(11, "python3", "j1-run", "python3 train.py"),
                                   Proc(12, "orted", "j0-old", "orted ...")])
    found = analyze.stray_findings([f], {"j1-run"})
    assert len(found) == 1 and found[0].data["pids"] == [10, 12]
    assert found[0].data["comms"] == {"10": "python3", "12": "orted"}
    assert "(job j0-old, ended)" in found[0].message
    assert analyze.stray_findings([NodeFacts("node-1", procs=[Proc(11, "python3", "j1-run", "")])], {"j1-run"}) == []


def test_clock_skew_is_measured_against_the_nodes_median():
    offsets = {"node-1": 0.01, "node-2": 0.02, "node-3": 3.0, "node-4": 0.4}
    found = analyze.clock_findings(offsets, {n: 0.01 for n in offsets})
    assert [(f.node, f.severity) for f in found] == [("node-3", "error")]
    found = analyze.clock_findings({"a": 0.0, "b": 0.0, "c": 0.5}, {})
    assert [(f.node, f.severity) for f in found] == [("c", "warning")]
    assert analyze.clock_findings({"a": 0.0, "b": 0.4}, {"a": 0.5, "b": 0.5}) == []  # within uncertainty


def test_report_is_clean_only_without_warnings_or_errors():
    r = Diagnosis("c", [CheckResult("x", [Finding("x", None, "info", "fyi")])])
    assert r.clean and r.exit_code == 0
    r.checks.append(CheckResult("y", [Finding("y", "n", "warning", "hmm")]))
    assert not r.clean and r.exit_code == 0 and r.checks[1].status == "warning"
    r.checks.append(CheckResult("z", [Finding("z", "n", "error", "bad")]))
    assert r.exit_code == 1 and r.checks[2].status == "error"
    assert CheckResult("s", skipped="why").status == "skipped"
