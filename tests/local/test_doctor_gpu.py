"""doctor's gpu and efa checks on a real 3-node local cluster (sshd in namespaces), where no GPU and no
EFA exist: stand-ins for nvidia-smi, journalctl, dcgmi and fi_info (tests/fakes/gpu_standins.py)
replay recordings on chosen nodes, first on PATH through ~/.bashrc (bash reads it for ssh commands).
Everything else is real: the node programs over ssh, their time boxes, the parsers and the CLI."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fakes import gpu_standins
from tests.fakes.gpu_standins import DERIVED, REAL
from tests.local.conftest import module_cluster, provider_state

pytestmark = pytest.mark.local
STANDIN = "/root/gpu-standin"   # where a node sees the stand-ins (its private /root)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 3, "dg")


def home(cluster, node: str) -> Path:
    """The node's private /root, as this machine sees it."""
    name, env = cluster
    return Path(provider_state(env, name)["nodes_dir"]) / node / "home"


@contextmanager
def standins(cluster, per_node: dict[str, dict]):
    """Stand-ins first on PATH of the nodes named, each replaying its recordings, for the with block."""
    for node, recordings in per_node.items():
        gpu_standins.write(home(cluster, node) / "gpu-standin", seen_as=STANDIN, **recordings)
        (home(cluster, node) / ".bashrc").write_text(f"export PATH={STANDIN}:$PATH\n")
    try:
        yield
    finally:
        for node in per_node:
            shutil.rmtree(home(cluster, node) / "gpu-standin")
            (home(cluster, node) / ".bashrc").unlink()


def doctor(cluster, *args, timeout=120):
    name, env = cluster
    proc = run_cli("doctor", "-c", name, *args, env=env, timeout=timeout)
    return proc


def check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


def test_without_gpus_or_efa_both_checks_say_skipped(cluster):
    proc = doctor(cluster, "--check", "gpu,efa")
    assert proc.returncode == 0, proc.stderr
    assert "[skip] gpu (no GPU)" in proc.stdout and "[skip] efa (no EFA interfaces)" in proc.stdout


def test_the_node_with_a_faulty_gpu_is_named_with_its_xid_and_fix_and_the_others_are_fine(cluster):
    with standins(cluster, {"node-2": {"xml": REAL / "smi-xml.out", "journal": REAL / "dmesg-xid.out"},
                            "node-3": {"xml": DERIVED / "smi-xml-p5-faulty.out",
                                       "journal": DERIVED / "journal-k-xid.out"}}):
        proc = doctor(cluster, "--check", "gpu", "--json")
        text = doctor(cluster, "--check", "gpu")
    report = json.loads(proc.stdout)
    gpu = check(report, "gpu")
    assert proc.returncode == 1 and gpu["status"] == "error"
    assert {f["node"] for f in gpu["findings"]} == {"node-3"}           # node-2's real H100 reads healthy
    assert gpu["data"]["no_nvidia_smi"] == ["node-1"] and sorted(gpu["data"]["nodes"]) == ["node-2", "node-3"]
    [off_bus] = [f for f in gpu["findings"] if f["data"].get("xid") == 79]
    assert off_bus["severity"] == "error" and "Xid 79 on PCI 0000:64:00" in off_bus["message"]
    assert off_bus["fix"].startswith("`clustertool reboot --nodes node-3`")
    [dbe] = [f for f in gpu["findings"] if f["data"].get("xid") == 48]
    assert "Xid 48 on GPU 1 (0000:75:00), 2 time(s)" in dbe["message"] and "nvidia-smi -r -i 1" in dbe["fix"]
    assert text.returncode == 1
    assert "ERROR   gpu node-3: Xid 79 on PCI 0000:64:00, 1 time(s), last at 2026-11-26T09:12:44+0000" in text.stdout
    assert "        fix: `clustertool reboot --nodes node-3`; if it happens again: `clustertool cordon node-3`" \
        in text.stdout


def test_a_dcgm_that_never_answers_is_reported_as_timed_out_within_the_box(cluster):
    """The dcgmi stand-in never ends by itself: doctor came back at all only because its box (3 s, the
    node's timeout(1)) stopped it, and says so.  Events, not seconds: the stand-in started (its pid file),
    the finding is the box's (not the whole check's limit, 4 x (60 + 3) + 6 + 30 s, which would read "could
    not run"), the stand-in is gone on the node.  run_cli's 600 s is a safety above that limit, not a bound."""
    with standins(cluster, {"node-3": {"xml": REAL / "smi-xml.out", "dcgm": gpu_standins.HANG}}):
        proc = doctor(cluster, "--check", "gpu", "--deep", "--deep-timeout", "3", "--json", timeout=600)
        name, env = cluster
        alive = run_cli("exec", "-c", name, "-n", "node-3", "--no-live", "--",
                        f"pid=$(cat {STANDIN}/dcgmi.pid) && echo started && kill -0 $pid", env=env)
    [hung] = check(json.loads(proc.stdout), "gpu")["findings"]
    assert (hung["node"], hung["severity"], hung["data"]["timed_out"]) == ("node-3", "warning", True)
    assert hung["message"] == "dcgmi diag -r 2 did not finish within 3 s (stopped; doctor does not wait longer)"
    assert "started" in alive.stdout, alive.stdout + alive.stderr   # the stand-in did run on the node
    assert alive.returncode != 0          # the stand-in was stopped on the node, not left running


def test_missing_efa_device_and_nccl_on_sockets_are_named(cluster):
    """fi_info stand-ins (4, 3 and 4 EFA devices) and a job whose output is an NCCL log that fell back
    to sockets on node-1 and node-2 (their host names, as NCCL prints them)."""
    name, env = cluster
    log = (DERIVED / "nccl-socket-fallback.log").read_text()
    log = log.replace("ip-10-1-0-11", "node-1").replace("ip-10-1-0-12", "node-2")
    fi4, fi3 = DERIVED / "fi-info-p4d-4of4.out", DERIVED / "fi-info-p4d-3of4.out"
    with standins(cluster, {"node-1": {"xml": REAL / "smi-xml.out", "fi_info": fi4},
                            "node-2": {"xml": REAL / "smi-xml.out", "fi_info": fi3},
                            "node-3": {"xml": REAL / "smi-xml.out", "fi_info": fi4}}):
        (home(cluster, "node-1") / "gpu-standin" / "nccl.log").write_text(log)
        ran = run_cli("run", "-c", name, "--np", "1", "--follow", "--name", "nccl-socket", "--",
                      "cat", f"{STANDIN}/nccl.log", env=env, timeout=120)
        assert ran.returncode == 0, ran.stderr
        proc = doctor(cluster, "--check", "efa", "--nccl-log", "nccl-socket", "--json")
    efa = check(json.loads(proc.stdout), "efa")
    assert proc.returncode == 1 and efa["status"] == "error"
    errors = sorted((f["node"], f["message"]) for f in efa["findings"] if f["severity"] == "error")
    assert [n for n, _ in errors] == ["node-1", "node-2", "node-2"], errors
    assert ("node-2", "fi_info -p efa lists 3 EFA device(s), 4 expected (the other nodes show that many): "
                      "rdmap16s27, rdmap32s27, rdmap144s27") in errors
    sockets = [f for f in efa["findings"] if "NET/Socket" in f["message"]]
    assert all("(job " in f["message"] and "nccl-socket" in f["message"] for f in sockets)
    assert all("aws-ofi-nccl" in f["fix"] and "FI_PROVIDER=efa" in f["fix"] for f in sockets)
