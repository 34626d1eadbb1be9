"""The C side: `make -C native test` (and the sanitizer build) pass, and the built
libraries export what NCCL looks for."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.native
NATIVE = REPO / "native"


def _missing() -> str | None:
    for tool in ("make", "gcc", "mpicc", "mpirun"):
        if not shutil.which(tool):
            return f"needs {tool} (apt-get install build-essential openmpi-bin libopenmpi-dev)"
    return None


def _make(target: str) -> subprocess.CompletedProcess:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return subprocess.run(["make", "--no-print-directory", "-C", str(NATIVE), target], capture_output=True,
                          text=True, timeout=900)


def _summary(out: str) -> tuple[int, int]:
    # the last line of the run; make's own "Leaving directory" trailer does not count
    last = [line for line in out.strip().splitlines() if not line.startswith("make")][-1]
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m, f"no summary line at the end: {last!r}"
    return int(m.group(1)), int(m.group(2))


def test_make_test_passes_with_multi_rank_collnet():
    proc = _make("test")
    passed, failed = _summary(proc.stdout)
    assert proc.returncode == 0 and failed == 0 and passed > 1000, proc.stdout[-3000:] + proc.stderr[-2000:]
    for np in (2, 3, 4):
        assert f"test_coll_mpi np={np}: " in proc.stdout
        # the servers algorithm against real reducers: K = 1, 2, n, n+1, fallback, a server dying
        servers = f"== test_servers_mpi np={np}: "
        assert servers in proc.stdout and f"{servers}0 passed" not in proc.stdout
    assert "== test_reducer: " in proc.stdout and "== test_reducer: 0 passed" not in proc.stdout
    # every ABI version at 2 and 3 ranks, CollNet/net pairing, logger flags, non-blocking connect
    for name in ("test_coll_versions_mpi np=2", "test_coll_versions_mpi np=3", "test_abi_versions",
                 "test_collnet_pairing", "test_collnet_pairing_forward", "test_net_nonblocking"):
        assert f"== {name}: " in proc.stdout and f"== {name}: 0 passed" not in proc.stdout, name


@pytest.mark.slow  # 2-3 minutes of a loaded 2-core box: `make test-slow`
def test_sanitizer_build_passes():
    proc = _make("asan")
    passed, failed = _summary(proc.stdout)
    assert proc.returncode == 0 and failed == 0 and passed > 1000, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_libraries_export_nccl_symbols():
    _make("all")
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("needs nm (binutils)")
    net = subprocess.run([nm, "-D", "--defined-only", str(NATIVE / "build/libnccl-net-clustertool.so")],
                         capture_output=True, text=True).stdout
    tuner = subprocess.run([nm, "-D", "--defined-only", str(NATIVE / "build/libnccl-tuner-clustertool.so")],
                           capture_output=True, text=True).stdout
    assert " ncclNetPlugin_v12" in net and " ncclCollNetPlugin_v12" in net
    assert " ncclTunerPlugin_v6" in tuner and " ncclTunerPlugin_v5" in tuner
    assert "ct_reduce" not in net, "internal symbols must stay hidden"
    for entry in ("ct_allreduce_open", "ct_allreduce_connect", "ct_allreduce", "ct_allreduce_close"):
        assert f" {entry}\n" in net, f"{entry}: the C entry point for non-NCCL programs"
    assert (NATIVE / "build/clustertool-reducer").is_file()


def _nccl_headers_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("nvidia.nccl") is not None


def test_gpu_target_builds_or_says_why():
    proc = _make("gpu")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    if shutil.which("nvcc") and shutil.which("mpicc") and _nccl_headers_installed():
        # everything the GPU program needs is here (as on CI): it must really compile
        assert (NATIVE / "build/nccl_plugin_allreduce").is_file(), out[-2000:]
    else:
        assert "gpu: skipped:" in out
