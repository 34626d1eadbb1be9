"""The gpu and efa checks end to end over a scripted transport: the real node programs run here under
sh (one home folder per node, clustertool.remote.testing), each node with its own stand-ins
(tests/fakes/gpu_standins.py) first on PATH, replaying recordings; doctor's API reads the results.
No ssh and no namespaces (tests/local/test_doctor_gpu.py runs the same over real sshd)."""

from __future__ import annotations

import os

import pytest

from clustertool import Cluster
from clustertool.core import state
from clustertool.remote.testing import ScriptedTransport
from tests.conftest import run_cli
from tests.fakes import gpu_standins
from tests.fakes.cluster import saved_cluster
from tests.fakes.gpu_standins import DERIVED, REAL

pytestmark = pytest.mark.unit


class StandinPath(ScriptedTransport):
    """Each node's commands see ``<its home>/standin`` first on PATH (where a test put stand-ins)."""

    def _argv(self, node, command, stdin):
        return ["env", f"PATH={self.home(node)}/standin:{os.environ['PATH']}", *super()._argv(node, command, stdin)]


def cluster_with(tmp_path, extra=None, **per_node):
    record = saved_cluster("hw", 3)
    for n in record.nodes:
        n.slots = 8 if n.name in per_node else 1
        n.extra.update(extra or {})
    state.save(record)
    fake = StandinPath(tmp_path / "nodes")
    for name, recordings in per_node.items():
        gpu_standins.write(fake.home(name) / "standin", **recordings)
    return Cluster(record, transport=fake)


def checks(diagnosis):
    return {c.name: c for c in diagnosis.checks}


def test_without_nvidia_smi_or_efa_anywhere_both_checks_skip_with_the_reason(ct_env, tmp_path):
    found = checks(cluster_with(tmp_path).doctor("gpu,efa"))
    assert (found["gpu"].status, found["gpu"].skipped) == ("skipped", "no GPU")
    assert (found["efa"].status, found["efa"].skipped) == ("skipped", "no EFA interfaces")


def test_the_faulty_node_is_named_with_its_xids_and_the_healthy_one_is_fine(ct_env, tmp_path):
    cluster = cluster_with(tmp_path, {"instance_type": "p5.48xlarge"},
                           **{"node-2": {"xml": REAL / "smi-xml.out", "journal": REAL / "dmesg-xid.out"},
                              "node-3": {"xml": DERIVED / "smi-xml-p5-faulty.out",
                                         "journal": DERIVED / "journal-k-xid.out"}})
    gpu = checks(cluster.doctor("gpu", since="2h"))["gpu"]
    assert gpu.status == "error" and gpu.data["no_nvidia_smi"] == ["node-1"] and gpu.data["since"] == "-2h"
    by_node = {}
    for f in gpu.findings:
        by_node.setdefault(f.node, []).append(f)
    assert set(by_node) == {"node-2", "node-3"}
    assert [f.message for f in by_node["node-2"]] == ["1 GPU(s) visible, a p5.48xlarge has 8"]  # a 1-GPU box
    assert {f.data.get("xid") for f in by_node["node-3"]} == {None, 48, 63, 79}


def test_a_hung_dcgm_is_reported_within_its_box_and_the_others_are_not_held_up(ct_env, tmp_path):
    cluster = cluster_with(tmp_path, **{"node-2": {"xml": REAL / "smi-xml.out", "dcgm": gpu_standins.HANG},
                                        "node-3": {"xml": REAL / "smi-xml.out",
                                                   "dcgm": DERIVED / "dcgmi-diag-r2-fail.json"}})
    gpu = checks(cluster.doctor("gpu", deep=2, deep_timeout=1))["gpu"]
    got = {(f.node, f.severity, f.message.split(":")[0].split(" did not")[0]) for f in gpu.findings
           if f.data.get("step") == "dcgm" or "test" in f.data}
    assert ("node-2", "warning", "dcgmi diag -r 2") in got                     # timed out
    assert ("node-3", "error", "dcgmi diag -r 2") in got                       # failed tests, read from its JSON
    [hung] = [f for f in gpu.findings if f.node == "node-2" and f.data.get("timed_out")]
    assert hung.message == "dcgmi diag -r 2 did not finish within 1 s (stopped; doctor does not wait longer)"
    assert gpu.seconds < 60


def test_a_node_missing_an_efa_device_and_a_socket_fallback_are_errors(ct_env, tmp_path):
    fi4, fi3 = DERIVED / "fi-info-p4d-4of4.out", DERIVED / "fi-info-p4d-3of4.out"
    cluster = cluster_with(tmp_path, {"instance_type": "p4d.24xlarge", "efa_interfaces": 4},
                           **{"node-1": {"xml": REAL / "smi-xml.out", "fi_info": fi4},
                              "node-2": {"xml": REAL / "smi-xml.out", "fi_info": fi3},
                              "node-3": {"xml": REAL / "smi-xml.out", "fi_info": fi4}})
    efa = checks(cluster.doctor("efa", nccl_log=str(DERIVED / "nccl-socket-fallback.log")))["efa"]
    errors = [(f.node, f.message) for f in efa.findings if f.severity == "error"]
    assert ("node-2", "fi_info -p efa lists 3 EFA device(s), 4 expected (attached at up): rdmap16s27, rdmap32s27, "
                      "rdmap144s27") in errors
    sockets = [m for n, m in errors if "NET/Socket" in m]
    assert len(sockets) == 2 and all(str(DERIVED / "nccl-socket-fallback.log") in m for m in sockets)
    assert efa.data["nodes"]["node-1"]["fi_info"] == ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
    fine = checks(cluster.doctor("efa", nccl_log=str(DERIVED / "nccl-efa-4nics.log")))["efa"]
    assert [f.node for f in fine.findings if f.severity == "error"] == ["node-2"]   # only the missing device


@pytest.mark.parametrize("args, line", [
    (("--since", "yesterday"), "error: --since 'yesterday': give an age (30m, 2h, 3d) or a time (2026-11-26 10:00)"),
    (("--deep", "--deep-level", "9"), "error: --deep-level 9: DCGM's diagnostic levels are 1 (seconds), 2 (about two "
                                      "minutes), 3 and 4 (long)"),
    (("--gpu-timeout", "0"), "error: --gpu-timeout and --deep-timeout are seconds above 0"),
])
def test_bad_gpu_options_are_one_line_before_any_node_is_touched(ct_env, args, line):
    saved_cluster("bad", 2)
    proc = run_cli("doctor", "-c", "bad", "--check", "gpu", *args, env=ct_env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[0] == line, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == ["hint: `clustertool doctor --help` says what each option takes"]
