"""The GPU proof's orchestration (bench/nccl_gpu.py main): ranks started with each variant's
environment, their logs read, the report and the log archive written and the exit code set
from what the logs say. No GPU, CUDA or NCCL exists here, so each rank is
tests/cli/nccl_gpu_standin.py, which prints the log lines NCCL 2.19, 2.23, 2.28 or 2.30 prints
for the environment it was given (it is not NCCL; the real worker, bench/nccl_gpu_worker.py,
runs only on a GPU machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402

pytestmark = pytest.mark.cli
STANDIN = Path(__file__).resolve().parent / "nccl_gpu_standin.py"
RELEASES = ("2.19.3", "2.23.4", "2.28.9", "2.30.7")
PREFLIGHT = {"tools": {t: False for t in nccl_gpu.TOOLS}, "gpu": "stand-in", "gpus": 1, "torch": "standin",
             "nccl": "?", "driver": "-", "compute_mode": "Default"}


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
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python: dict(PREFLIGHT))
    monkeypatch.setattr(nccl_gpu, "build_plugin", lambda build: "prebuilt (test)")   # make: tests/native
    for knob in ("STANDIN_FAIL_RANK", "STANDIN_DLOPEN_ERROR", "STANDIN_COLLNET_FAIL", "STANDIN_SECONDS_PER_MB",
                 "STANDIN_HANG", "STANDIN_NCCL"):
        monkeypatch.delenv(knob, raising=False)
    return build


def proof(capsys, out: Path, *args: str) -> tuple[int, str]:
    code = nccl_gpu.main(["--mode", "hostid", "--rate", "none", "--sizes", "1M,4M", "--out", str(out), *args])
    return code, capsys.readouterr().out


def archived(out: Path) -> list[str]:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return sorted(Path(n).name for n in tar.getnames() if "." in Path(n).name)


def assert_outputs(out: Path, verdict: str) -> dict:
    """Every path ends with the report (text and JSON) and one archive."""
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "report.json", "report.txt"]
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == verdict
    assert (verdict + ":") in (out / "report.txt").read_text()
    return doc


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_passes_when_its_log_shows_plugin_and_collnet(standin, capsys, tmp_path, monkeypatch, release):
    monkeypatch.setenv("STANDIN_NCCL", release)
    code, out = proof(capsys, tmp_path / "o", "--ranks", "3")
    assert code == 0, out
    assert f"NCCL {release} (torch standin), 3 ranks, ranks on loopback with distinct" in out
    abi = {"2.19.3": 7, "2.23.4": 8, "2.28.9": 11, "2.30.7": 12}[release]
    assert f"[net] NCCL {release}; network clustertool; net plugin clustertool (v{abi})" in out
    assert "[socket] NCCL" in out and "network Socket" in out
    if release != "2.19.3":      # 2.19 prints no per-size choice; the plugin's own line proves CollNet ran
        assert "COLLNET_CHAIN/SIMPLE" in out
    assert "PASS: NCCL loaded the plugin and ran CollNet where asked" in out
    doc = assert_outputs(tmp_path / "o", "PASS")
    assert [v["variant"] for v in doc["variants"]] == list(plan.VARIANTS)
    assert "collnet-sharded.rank2.log" in archived(tmp_path / "o")


@pytest.mark.parametrize("release", RELEASES)
def test_a_plugin_found_but_not_loadable_names_the_dlopen_error(standin, capsys, tmp_path, monkeypatch, release):
    monkeypatch.setenv("STANDIN_NCCL", release)
    monkeypatch.setenv("STANDIN_DLOPEN_ERROR", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "socket,net")
    assert code == 1
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("net: NCCL did not load"))
    assert "version `GLIBC_2.34' not found" in line, line
    assert_outputs(tmp_path / "o", "FAIL")


@pytest.mark.parametrize("release", RELEASES)
def test_a_failed_collnet_connect_is_the_reason_not_a_missing_allreduce(standin, capsys, tmp_path, monkeypatch,
                                                                       release):
    monkeypatch.setenv("STANDIN_NCCL", release)
    monkeypatch.setenv("STANDIN_COLLNET_FAIL", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "collnet-ring")
    assert code == 1
    assert "collnet-ring: NCCL did not run CollNet: CollNet setup failed on some rank" in out
    assert "no allreduce ran" not in out


def test_a_plugin_nccl_cannot_find_fails_the_proof(standin, capsys, tmp_path):
    (standin / plan.NET_LIB).unlink()
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "socket,net")
    assert code == 1
    assert "net: NCCL did not load the clustertool plugin (NET/Plugin: Could not find: clustertool " \
           "libnccl-net-clustertool.so" in out


def test_collnet_that_nccl_did_not_choose_fails_the_proof(standin, capsys, tmp_path):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "collnet-ring", "--no-tuner")
    assert code == 1 and "collnet-ring: CollNet was set up but no allreduce ran on it" in out


def test_a_rank_that_dies_fails_the_proof_and_leaves_no_process(standin, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("STANDIN_FAIL_RANK", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "3", "--variants", "net")
    assert code == 1
    assert "net: rank 1 exited 1: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp" in out
    assert {"net.rank0.log", "net.rank1.log", "net.rank2.log", "net.env"} <= set(archived(tmp_path / "o"))
    left = subprocess.run(["pgrep", "-f", str(STANDIN)], capture_output=True, text=True).stdout.split()
    assert not left, f"stand-in ranks left running: {left}"


def test_nccl_env_reaches_every_rank_and_the_report(standin, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_LEVEL", "SYS")     # inherited: dropped, so it cannot skew a variant
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "socket,net",
                      "--nccl-env", "NCCL_P2P_DISABLE=1", "--nccl-env", "NCCL_MNNVL_ENABLE=0")
    assert code == 0, out
    assert "--nccl-env: NCCL_P2P_DISABLE=1 NCCL_MNNVL_ENABLE=0" in out
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert doc["nccl_env"] == {"NCCL_P2P_DISABLE": "1", "NCCL_MNNVL_ENABLE": "0"}
    with tarfile.open(tmp_path / "o" / "logs.tar.gz") as tar:
        env = tar.extractfile("nccl-gpu-logs/net.env").read().decode()
    assert "NCCL_P2P_DISABLE=1\n" in env and "NCCL_NET_PLUGIN=clustertool\n" in env and "NCCL_P2P_LEVEL" not in env


def test_a_budget_of_60_s_stops_sizes_early_and_still_passes(standin, capsys, tmp_path, monkeypatch):
    """12 s for the first variant (48 s shared by 4), its ranks stop 5 s before that; each MiB takes
    0.25 s: 1M..8M end inside 7 s, 16M would not. Later variants inherit what it left unused."""
    monkeypatch.setenv("STANDIN_SECONDS_PER_MB", "0.25")
    began = time.monotonic()
    code = nccl_gpu.main(["--mode", "hostid", "--rate", "none", "--sizes", "1M:16M", "--budget", "60",
                          "--ranks", "2", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert time.monotonic() - began < 60
    assert code == 0, out
    doc = assert_outputs(tmp_path / "o", "PASS")
    first = doc["variants"][0]
    assert first["share_s"] == 12.0 and first["stopped_before"] == 16 << 20
    assert [r["size"] >> 20 for r in first["results"]] == [1, 2, 4, 8]
    assert all(v["results"] and v["share_s"] >= 12.0 for v in doc["variants"])
    assert "socket           stopped before 16M: the next size would not end inside its 12 s share of --budget" \
        in out


def test_a_hung_variant_is_cut_at_its_share_and_the_rest_still_run(standin, capsys, tmp_path, monkeypatch):
    """Every rank of the first variant hangs: it is killed at its share, fails, and the next variant runs."""
    real = plan.variant_env

    def hang_first(variant, base, **kw):
        env = real(variant, base, **kw)
        if variant == "socket":
            env["STANDIN_HANG"] = "1"
        return env

    monkeypatch.setattr(plan, "variant_env", hang_first)
    code = nccl_gpu.main(["--mode", "hostid", "--rate", "none", "--sizes", "1M", "--budget", "40", "--ranks", "2",
                          "--variants", "socket,net", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 1
    assert "socket: rank 0 no result within its 14 s share of --budget" in out
    doc = assert_outputs(tmp_path / "o", "FAIL")
    assert doc["variants"][1]["results"] and not doc["variants"][1]["error"]
    left = subprocess.run(["pgrep", "-f", str(STANDIN)], capture_output=True, text=True).stdout.split()
    assert not left


def test_sigterm_ends_with_the_report_and_archive(standin, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_SECONDS_PER_MB", "1")
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = nccl_gpu.main(["--mode", "hostid", "--rate", "none", "--sizes", "1M:64M", "--ranks", "2",
                              "--out", str(tmp_path / "o")])
    finally:
        timer.cancel()
    out = capsys.readouterr().out
    assert code == 1
    assert "note: interrupted by SIGTERM" in out
    doc = assert_outputs(tmp_path / "o", "FAIL")
    assert any("not run" in p for p in doc["problems"])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("bad,why", [
    (["--nccl-env", "NCCL_HOSTID=x"], "the proof sets NCCL_HOSTID itself"),
    (["--nccl-env", "P2P"], "want NAME=VALUE"),
    (["--budget", "10"], "--budget must be at least 30 s"),
])
def test_bad_arguments_are_one_line(bad, why, capsys):
    with pytest.raises(SystemExit) as e:
        nccl_gpu.parse_args(bad)
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_no_gpu_is_exit_2_with_a_report(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(nccl_gpu, "preflight",
                        lambda python: dict(PREFLIGHT, problem="no CUDA GPU visible to torch (this proof needs one)"))
    code = nccl_gpu.main(["--out", str(tmp_path / "o"), "--mode", "hostid"])
    assert code == 2
    assert "ERROR: no CUDA GPU visible to torch" in (tmp_path / "o" / "report.txt").read_text()


def test_a_prebuilt_plugin_is_used_where_there_is_no_compiler(monkeypatch, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    for lib in (plan.NET_LIB, plan.TUNER_LIB):
        (build / lib).write_bytes(b"")
    monkeypatch.setattr(nccl_gpu.shutil, "which", lambda name: None)
    assert nccl_gpu.build_plugin(build) == "prebuilt plugin libraries (no make or C compiler here)"
    (build / plan.NET_LIB).unlink()
    with pytest.raises(RuntimeError, match="no make/C compiler to build it: run `make -C native plugins`"):
        nccl_gpu.build_plugin(build)
