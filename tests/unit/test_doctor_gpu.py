"""`doctor --check gpu`: nvidia-smi's XML and csv, Xid lines, DCGM's JSON, the findings, and the node
program with its time boxes.

The healthy readings are real (tests/unit/data/gpu-h100-recorded, one H100); the faulty ones are
derived from them and from the documented formats (gpu-faulty-derived, README.md there). Where a
program runs, it is the real node program (nodeprogs/gpu_health.sh) under sh, with stand-ins
(tests/fakes/gpu_standins.py) for nvidia-smi, journalctl and dcgmi, which this machine lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from clustertool.core.errors import UsageError
from clustertool.doctor import gpu, hwchecks, smi, xid
from tests.fakes import gpu_standins
from tests.fakes.gpu_standins import DERIVED, REAL

pytestmark = pytest.mark.unit


def steps_of(xml=REAL / "smi-xml.out", journal=None, dcgm=None, xml_rc=0, dcgm_rc=0):
    out = {"smi-xml": gpu.Step(xml_rc, xml.read_text() if hasattr(xml, "read_text") else xml),
           "smi-apps": gpu.Step(0, "")}
    if journal is not None:
        out["xid"] = gpu.Step(0, journal.read_text(), "journalctl")
    if dcgm is not None:
        out["dcgm"] = gpu.Step(dcgm_rc, dcgm.read_text() if hasattr(dcgm, "read_text") else dcgm)
    return out


def problems(findings):
    return [f for f in findings if f.severity in ("warning", "error")]


def test_the_real_h100_recording_reads_as_one_healthy_gpu():
    [g] = smi.parse_xml((REAL / "smi-xml.out").read_text())
    assert (g.index, g.bus_id, g.name) == (0, "00000000:00:06.0", "NVIDIA H100 80GB HBM3")
    assert (g.gen, g.gen_max, g.width, g.width_max, g.persistence) == (5, 5, 16, 16, "Enabled")
    assert g.ecc_count("volatile", "uncorrected") == 0 and "volatile.dram.uncorrected" in g.ecc
    assert (g.remap_pending, g.remap_failure, g.retired_pending) == (False, False, None)  # N/A is unknown, not 0
    assert g.reasons["gpu_idle"] and not g.reasons["hw_slowdown"] and g.recovery_action == "None"
    findings, data = gpu.node_findings("node-1", steps_of(journal=REAL / "dmesg-xid.out"), slots=1)
    assert findings == [] and data["xids"] == []   # the driver's own lines in that log are not Xids


def test_the_real_query_csv_reads_as_the_same_gpu_as_the_xml():
    [x] = smi.parse_xml((REAL / "smi-xml.out").read_text())
    [c] = smi.parse_csv((REAL / "smi-query.out").read_text())
    fields = ("index", "bus_id", "uuid", "persistence", "gen", "gen_max", "width", "width_max", "mem_used",
              "mem_total", "power_limit", "remap_pending", "remap_failure", "retired_pending")
    assert [getattr(c, f) for f in fields] == [getattr(x, f) for f in fields]
    assert {k: v for k, v in c.reasons.items() if v} == {"gpu_idle": True}
    assert gpu.gpu_findings("node-1", c) == []


def test_the_csv_fallback_finds_a_narrow_link_when_the_xml_fails():
    steps = {"smi-xml": gpu.Step(6, "Unable to determine the device handle for gpu 0000:53:00.0: Unknown Error"),
             "smi-csv": gpu.Step(0, (DERIVED / "smi-query-x8.out").read_text())}
    findings, data = gpu.node_findings("node-2", steps, slots=1)
    assert data["source"] == "nvidia-smi --query-gpu"
    assert [(f.severity, f.data.get("width")) for f in findings] == [("error", 8)]
    assert "x8, the maximum is gen 5 x16" in findings[0].message


def test_every_fault_of_the_derived_p5_recording_is_named_once_with_its_fix():
    steps = steps_of(DERIVED / "smi-xml-p5-faulty.out", DERIVED / "journal-k-xid.out")
    findings, data = gpu.node_findings("node-5", steps, slots=8, instance_type="p5.48xlarge")
    def key(t):
        return t[0], -1 if t[1] is None else t[1], t[2] or 0

    got = sorted(((f.severity, f.data.get("gpu"), f.data.get("xid")) for f in findings), key=key)
    assert got == sorted([
        ("error", None, None),      # 7 GPUs of a p5.48xlarge's 8
        ("error", 1, None), ("warning", 1, None),     # DBEs; row remap pending
        ("error", 2, None),         # row remapping failed
        ("error", 3, None),         # HW slowdown + power brake
        ("error", 4, None),         # x8 of x16
        ("warning", 5, None),       # persistence off
        ("warning", 6, None), ("warning", 6, None),   # busy at gen 3 of 5; 30 GiB with no process
        ("error", 1, 48), ("warning", 1, 63), ("error", None, 79)], key=key), got
    by = {(f.data.get("gpu"), f.data.get("xid"), f.severity): f for f in findings}
    missing = by[(None, None, "error")]
    assert missing.message == "7 GPU(s) visible, a p5.48xlarge has 8"
    assert "`clustertool reboot --nodes node-5`" in missing.fix and "`clustertool cordon node-5`" in missing.fix
    dbe = by[(1, 48, "error")]
    assert dbe.data["count"] == 2 and "last at 2026-11-26T09:41:17+0000" in dbe.message
    assert "sudo nvidia-smi -r -i 1" in dbe.fix and "if it comes back after the reset" in dbe.fix
    off_bus = by[(None, 79, "error")]
    assert "PCI 0000:64:00" in off_bus.message and "fallen off the bus" in off_bus.message
    assert off_bus.fix.startswith("`clustertool reboot --nodes node-5`")
    assert "HW slowdown, HW power brake slowdown" in by[(3, None, "error")].message
    assert "replace the instance" in by[(2, None, "error")].fix
    assert [g["pcie"] for g in data["gpus"]][0] == "gen1/5 x16/16"   # GPU 0: idle at gen 1, no finding


def test_an_idle_gpu_below_its_pcie_generation_is_fine_a_busy_one_is_not():
    [g] = smi.parse_xml((REAL / "smi-xml.out").read_text())
    g.gen = 2
    assert gpu.gpu_findings("n", g) == []            # idle: the driver lowers the generation to save power
    g.util = 90
    [f] = gpu.gpu_findings("n", g)
    assert f.severity == "warning" and "PCIe gen 2 x16, the maximum is gen 5 x16 while 90% busy" in f.message


K = "2026-11-26T10:00:0{}+0000 ip-1 kernel: NVRM: "
XID_LINES = "\n".join([
    "[  812.301122] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",   # older drivers: no pid
    K.format(0) + "Xid (PCI:0000:53:00): 13, pid=4711, name=python3, Graphics Exception",
    K.format(1) + "Xid (PCI:0000:53:00 GPU-I:01 GPU-CI:00): 94, pid='<unknown>', name=<unknown>, "   # MIG
                  "Contained: CE User Channel (0x9)",
    K.format(2) + "Xid (PCI:0000:53:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed "
                  "from 0x0 (None) to 0x2 (Node Reboot Required)",
    K.format(3) + "GPU at PCI:0000:53:00: GPU-5ef4"])


def test_xid_lines_of_every_driver_format_are_read():
    events = xid.parse_kernel_log(XID_LINES)
    assert [(e.xid, e.pci, e.when, e.pid, e.process) for e in events] == [
        (79, "0000:2b:00", "812.301122", "", ""),
        (13, "0000:53:00", "2026-11-26T10:00:00+0000", "4711", "python3"),
        (94, "0000:53:00", "2026-11-26T10:00:01+0000", "", ""),
        (154, "0000:53:00", "2026-11-26T10:00:02+0000", "", "")]
    assert events[0].message == "GPU has fallen off the bus." and events[2].message.startswith("Contained:")
    assert xid.bus_device("00000000:53:00.0") == xid.bus_device("0000:53:00") == ("53", "00")


def test_each_xid_gets_the_catalogue_action_and_154_says_which():
    [g] = smi.parse_xml((REAL / "smi-xml.out").read_text())
    g.bus_id = "00000000:53:00.0"
    found = {f.data["xid"]: f for f in gpu.xid_findings("node-2", xid.parse_kernel_log(XID_LINES), [g])}
    assert {n: (f.severity, f.data["action"], f.data["gpu"]) for n, f in found.items()} == {
        79: ("error", xid.REBOOT, None), 13: ("warning", xid.RESTART_APP, 0),
        94: ("warning", xid.RESTART_APP, 0), 154: ("error", xid.REBOOT, 0)}
    assert found[13].fix.startswith("restart the job; if it recurs on this node only: reset GPU 0")
    assert "(process python3 pid 4711)" in found[13].message


DCGM3 = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Integration", "tests": [{"name": "PCIe", "results": [
        {"gpu_id": "0", "status": "Pass"},
        {"gpu_id": "1", "status": "Fail", "warnings": [{"warning": "GPU 1 PCIe replay count violated",
                                                         "error_id": 107, "error_category": 13,
                                                         "error_severity": 2}]}]}]}],
    "version": "3.3.9"}}


def test_dcgm_json_of_dcgm_3_and_4_names_the_failed_test_and_gpu():
    fails, runtime = gpu.parse_dcgm((DERIVED / "dcgmi-diag-r2-fail.json").read_text())
    assert runtime == "" and [(r.test, r.gpu, r.status) for r in fails] == [
        ("software", 1, "Fail"), ("software", 2, "Fail"), ("memory", 2, "Fail")]
    fails, _ = gpu.parse_dcgm("Successfully ran diagnostic\n" + json.dumps(DCGM3))
    [f] = gpu._dcgm("node-3", {"dcgm": gpu.Step(226, json.dumps(DCGM3))}, gpu.Options(deep=2))
    assert (f.severity, f.data["gpu"]) == ("error", 1)
    assert f.message == "dcgmi diag -r 2: PCIe failed on GPU 1 (PCIe): GPU 1 PCIe replay count violated"
    broken = {"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}
    [f] = gpu._dcgm("node-3", {"dcgm": gpu.Step(1, json.dumps(broken))}, gpu.Options(deep=1))
    assert f.severity == "warning" and "host engine" in f.message


def test_a_step_that_overran_its_box_is_reported_as_timed_out():
    steps = {"smi-xml": gpu.Step(124, ""), "xid": gpu.Step(137, "", "journalctl"), "dcgm": gpu.Step(124, "")}
    findings, _ = gpu.node_findings("node-4", steps, slots=8, options=gpu.Options(box=5, deep=2, deep_box=7))
    assert [(f.severity, f.message) for f in findings] == [
        ("error", "nvidia-smi -q -x did not answer within 5 s (stopped)"),
        ("warning", "reading the kernel log did not finish within 5 s (stopped): Xid events not checked"),
        ("warning", "dcgmi diag -r 2 did not finish within 7 s (stopped; doctor does not wait longer)")]
    assert all(f.data["timed_out"] for f in findings)


def test_nvidia_smi_that_cannot_reach_the_driver_is_one_clear_error():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
            "latest NVIDIA driver is installed and running.\n")
    findings, _ = gpu.node_findings("node-6", {"smi-xml": gpu.Step(9, text)}, slots=8)
    [f] = findings
    assert f.severity == "error" and "nvidia-smi -q -x failed (exit 9)" in f.message
    assert "couldn't communicate with the NVIDIA driver" in f.message and "reboot --nodes node-6" in f.fix


def test_fewer_gpus_than_slots_is_an_error_where_the_type_is_unknown():
    findings, _ = gpu.node_findings("node-1", steps_of(), slots=2)
    assert [f.message for f in findings] == [
        "1 GPU(s) visible but 2 slot(s) in the hostfile: ranks would share GPUs or fail to start"]


def test_since_and_deep_options_are_checked_in_one_line():
    assert [hwchecks.since_arg(v) for v in (None, "2h", "30m", "3d", "2026-11-26 10:00", "2026-11-26T10:00")] == [
        "", "-2h", "-30m", "-3d", "2026-11-26 10:00", "2026-11-26 10:00"]
    with pytest.raises(UsageError, match="give an age"):
        hwchecks.since_arg("yesterday; rm -rf /")
    with pytest.raises(UsageError, match="DCGM's diagnostic levels"):
        hwchecks.gpu_options(7, None, 60, 600)
    assert hwchecks.gpu_options(True, "2h", 0.2, 600) == gpu.Options(box=0.2, deep=2, deep_box=600, since="-2h")
    script = hwchecks.gpu_script(gpu.Options(box=0.2, deep=1, since="2026-11-26 10:00"))
    assert "BOX=1\n" in script and "SINCE='2026-11-26 10:00'\n" in script   # at least 1 s: timeout 0 = no limit
    assert subprocess.run(["sh", "-n"], input=script.encode()).returncode == 0


def run_node_program(tmp_path, options, **recordings):
    """The real gpu_health.sh under sh here, the stand-ins first on PATH."""
    gpu_standins.write(tmp_path / "bin", **recordings)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    t0 = time.monotonic()
    proc = subprocess.run(["sh", "-s"], input=hwchecks.gpu_script(options), capture_output=True, text=True,
                          env=env, timeout=120)
    return proc, time.monotonic() - t0


def test_the_node_program_reads_the_stand_ins_and_stops_a_hung_dcgm_in_its_box(tmp_path):
    proc, _ = run_node_program(tmp_path, gpu.Options(box=20, deep=2, deep_box=1),
                               xml=DERIVED / "smi-xml-p5-faulty.out", journal=DERIVED / "journal-k-xid.out",
                               dcgm=gpu_standins.HANG)
    assert proc.returncode == 0, proc.stderr
    steps = gpu.sections(proc.stdout)
    assert sorted(steps) == ["dcgm", "smi-apps", "smi-xml", "xid"]
    assert steps["xid"].words == "journalctl" and steps["dcgm"].timed_out
    findings, _ = gpu.node_findings("node-5", steps, slots=8, instance_type="p5.48xlarge",
                                    options=gpu.Options(box=20, deep=2, deep_box=1))
    assert {f.data.get("xid") for f in findings} == {None, 48, 63, 79}
    assert "dcgmi diag -r 2 did not finish within 1 s" in findings[-1].message
    with pytest.raises(ProcessLookupError):   # timeout(1) stopped the stand-in's process group: nothing left
        os.kill(int((tmp_path / "bin" / "dcgmi.pid").read_text()), 0)


def test_the_node_program_says_none_without_nvidia_smi(tmp_path):
    env = dict(os.environ, PATH="/usr/bin:/bin")
    assert not any(os.access(f"{d}/nvidia-smi", os.X_OK) for d in ("/usr/bin", "/bin"))
    proc = subprocess.run(["sh", "-s"], input=hwchecks.gpu_script(gpu.Options()), capture_output=True, text=True,
                          env=env, timeout=30)
    assert proc.stdout == f"{gpu.MARK} none rc=0\n"


def test_without_a_journal_the_kernel_log_comes_from_dmesg(tmp_path):
    """A machine with journalctl but no journal (a container; this one) answers "No journal files were
    found." and exit 0: the node program reads dmesg instead (both stand-ins here)."""
    bin_dir = tmp_path / "bin"
    gpu_standins.write(bin_dir, xml=REAL / "smi-xml.out")
    programs = {"journalctl": "echo 'No journal files were found.' >&2; echo '-- No entries --'",
                "dmesg": f"cat {DERIVED / 'journal-k-xid.out'}"}
    for name, body in programs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n# stand-in for {name} (clustertool tests)\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for since, words in (("", "dmesg"), ("-2h", "dmesg (this boot: --since applies to journalctl only)")):
        proc = subprocess.run(["sh", "-s"], input=hwchecks.gpu_script(gpu.Options(since=since)), capture_output=True,
                              text=True, env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"), timeout=60)
        step = gpu.sections(proc.stdout)["xid"]
        assert (step.rc, step.words) == (0, words)
        assert [e.xid for e in xid.parse_kernel_log(step.text)] == [79, 48, 63, 48]
