"""The GPU proof's orchestration (bench/nccl_gpu.py main): ranks started with each variant's
environment, their logs read, the report printed and the exit code set from what the logs
say. No GPU, CUDA or NCCL exists here, so each rank is tests/cli/nccl_gpu_standin.py, which
prints NCCL's log lines for the environment it was given (it is not NCCL; the real worker,
bench/nccl_gpu_worker.py, runs only on a GPU machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402

pytestmark = pytest.mark.cli
STANDIN = Path(__file__).resolve().parent / "nccl_gpu_standin.py"


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """Ranks are the stand-in; the 'built plugin' is two files in a temp build folder."""
    native = tmp_path / "native"
    build = native / "build"
    build.mkdir(parents=True)
    for lib in (plan.NET_LIB, plan.TUNER_LIB):
        (build / lib).write_bytes(b"")
    monkeypatch.setattr(plan, "WORKER", STANDIN)
    monkeypatch.setattr(plan, "NATIVE", native)
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python: None)
    monkeypatch.setattr(nccl_gpu, "build_plugin", lambda build: None)   # make is tested by tests/native
    monkeypatch.delenv("STANDIN_FAIL_RANK", raising=False)
    return build


def proof(capsys, *args: str) -> tuple[int, str]:
    code = nccl_gpu.main(["--mode", "hostid", "--rate", "none", "--sizes", "1M,4M", *args])
    return code, capsys.readouterr().out


def test_all_four_variants_pass_when_nccl_reports_plugin_and_collnet(standin, capsys):
    code, out = proof(capsys, "--ranks", "3")
    assert code == 0, out
    assert out.splitlines()[0].startswith("NCCL 2.26.6 (torch standin), 3 ranks, ranks on loopback with distinct")
    assert "collnet-sharded      4M" in out and "COLLNET_CHAIN/SIMPLE" in out
    assert "[net] NCCL 2.26.6; network clustertool; net plugin clustertool (v10)" in out
    assert "[socket] NCCL 2.26.6; network Socket" in out
    assert "PASS: NCCL loaded the plugin and ran CollNet where asked" in out


def test_a_plugin_nccl_cannot_find_fails_the_proof(standin, capsys):
    (standin / plan.NET_LIB).unlink()
    code, out = proof(capsys, "--ranks", "2", "--variants", "socket,net")
    assert code == 1
    assert "net: NCCL did not load the clustertool plugin (NET/Plugin: Could not find: clustertool " \
           "libnccl-net-clustertool.so)" in out


def test_collnet_that_nccl_did_not_choose_fails_the_proof(standin, capsys):
    code, out = proof(capsys, "--ranks", "2", "--variants", "collnet-ring", "--no-tuner")
    assert code == 1 and "collnet-ring: CollNet was set up but no allreduce ran on it" in out


def test_a_rank_that_dies_fails_the_proof_and_leaves_no_process(standin, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("STANDIN_FAIL_RANK", "1")
    code, out = proof(capsys, "--ranks", "3", "--variants", "net", "--keep-logs", str(tmp_path / "logs"))
    assert code == 1
    assert "net: rank 1 exited 1: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp" in out
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["net.rank0.log", "net.rank1.log", "net.rank2.log"]
    left = subprocess.run(["pgrep", "-f", str(STANDIN)], capture_output=True, text=True).stdout.split()
    assert not left, f"stand-in ranks left running: {left}"
