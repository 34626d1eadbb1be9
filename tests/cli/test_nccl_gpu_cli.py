"""The GPU proof's orchestration (bench/nccl_gpu.py main): ranks started with each variant's
environment, their logs read, the report and the log archive written and the exit code set
from what the logs say. No GPU, CUDA or NCCL exists here, so each rank is
tests/cli/nccl_gpu_standin.py, which prints the log lines NCCL 2.19, 2.23, 2.28 or 2.30 prints
for the environment it was given (it is not NCCL; the real workers, bench/nccl_gpu_worker.py and
bench/nccl_gpu_ddp.py, need a GPU for NCCL: here they run on gloo, in test_nccl_gpu_workers.py),
and CUDA MPS is tests/cli/nccl_gpu_mps_standin.py. The reduction servers are the real
clustertool-reducer (native/build)."""

from __future__ import annotations

import json
import os
import re
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
import nccl_gpu_procs as procs  # noqa: E402

pytestmark = pytest.mark.cli
STANDIN = Path(__file__).resolve().parent / "nccl_gpu_standin.py"
MPS_STANDIN = Path(__file__).resolve().parent / "nccl_gpu_mps_standin.py"
REDUCER = REPO / "native" / "build" / plan.REDUCER
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
    if REDUCER.is_file():   # the real reduction server (make -C native plugins)
        (build / plan.REDUCER).symlink_to(REDUCER)
    monkeypatch.setattr(plan, "WORKER", STANDIN)
    monkeypatch.setattr(plan, "DDP_WORKER", STANDIN)
    monkeypatch.setattr(plan, "NATIVE", native)
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python, env=None, mps=False: dict(PREFLIGHT))
    monkeypatch.setattr(nccl_gpu, "build_plugin", lambda build, prebuilt=False: "prebuilt (test)")  # tests/native
    for knob in ("STANDIN_FAIL_RANK", "STANDIN_DLOPEN_ERROR", "STANDIN_COLLNET_FAIL", "STANDIN_SECONDS_PER_MB",
                 "STANDIN_HANG", "STANDIN_NCCL", "STANDIN_NO_STATS", "STANDIN_DDP_DIVERGE", "STANDIN_MPS_FAIL",
                 "STANDIN_MPS_IGNORE_QUIT", "STANDIN_FAIL_UNDER_MPS", "CUDA_MPS_PIPE_DIRECTORY",
                 "CUDA_MPS_LOG_DIRECTORY"):
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
    assert [v["variant"] for v in doc["variants"]] == list(plan.BASIC)
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
    left = left_running(tmp_path)
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
    assert not left_running(tmp_path)


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
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python, env=None, mps=False:
                        dict(PREFLIGHT, problem="no CUDA GPU visible to torch (this proof needs one)"))
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


def test_prebuilt_uses_the_copied_libraries_even_where_make_exists(monkeypatch, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    for lib in (plan.NET_LIB, plan.TUNER_LIB):
        (build / lib).write_bytes(b"")
    ran = []
    monkeypatch.setattr(nccl_gpu.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(nccl_gpu.subprocess, "run", lambda *a, **k: ran.append(a) or None)
    assert nccl_gpu.build_plugin(build, prebuilt=True) == "prebuilt plugin libraries (--prebuilt: not rebuilt here)"
    assert ran == []
    (build / plan.TUNER_LIB).unlink()
    with pytest.raises(RuntimeError, match="--prebuilt: no plugin at .*libnccl-tuner"):
        nccl_gpu.build_plugin(build, prebuilt=True)


# ---------------- issue 31: reduction servers, pacing, MPS, stats, the training step ----------------
needs_reducer = pytest.mark.skipif(not REDUCER.is_file(), reason="needs the reducer: make -C native plugins")


def _ours(pid: str) -> bool:
    """Started by this pytest process: the stand-ins inherit its environment, and under xdist other workers
    run the same stand-ins at the same time (their processes are theirs to check)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:     # gone meanwhile: not left running
        return False
    return f"PYTEST_XDIST_WORKER={worker}".encode() in env


def left_running(tmp_path: Path) -> list[str]:
    """Processes started from this test's folder (the reducers run from its native/build) or by the stand-ins."""
    found = []
    for pattern in (str(tmp_path), str(STANDIN), str(MPS_STANDIN)):
        pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        found += [pid for pid in pids if _ours(pid)]
    return found


def archive_text(out: Path, name: str) -> str:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return tar.extractfile(f"nccl-gpu-logs/{name}").read().decode()


@pytest.fixture
def mps_on_path(tmp_path, monkeypatch):
    """The MPS stand-in on PATH under the real program's name."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / procs.MPS_CONTROL
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} {MPS_STANDIN} \"$@\"\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return tool


@needs_reducer
def test_servers_variant_starts_one_reducer_per_rank_and_stops_them(standin, capsys, tmp_path):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "3", "--variants", "collnet-servers", "--sizes", "1M")
    assert code == 0, out
    assert "[collnet-servers] NCCL 2.28.9; network clustertool" in out and "plugin algorithm servers" in out
    env = archive_text(tmp_path / "o", "collnet-servers.env")
    endpoints = next(ln for ln in env.splitlines() if ln.startswith("CLUSTERTOOL_REDUCERS=")).split("=")[1].split(",")
    assert len(endpoints) == 3 and all(e.startswith("127.0.0.1:") for e in endpoints)
    assert "CLUSTERTOOL_COLLNET_ALGO=servers\n" in env
    for i, endpoint in enumerate(endpoints):
        log = archive_text(tmp_path / "o", f"collnet-servers.reducer{i}.log")
        assert f"listening on {endpoint}" in log
        assert log.count("refused connection from 127.0.0.1") == 3, "each stand-in rank connected to it"
        assert "exiting on SIGTERM" in log, "stopped with TERM, not killed"
    assert "standin: reached 3 reducer(s)" in archive_text(tmp_path / "o", "collnet-servers.rank2.log")
    assert re.search(r"    reducer 0 \(127\.0\.0\.1:\d+\): 0 session\(s\), 0 ended, 0 reductions, 0\.0 MB, "
                     r"3 connection\(s\) refused", out), out
    assert not left_running(tmp_path)


@needs_reducer
def test_servers_that_the_plugin_cannot_reach_fail_the_proof_with_the_plugins_reason(standin, capsys, tmp_path,
                                                                                    monkeypatch):
    real = nccl_gpu.start_servers

    def one_dead(spec, args, ctx, work):
        red = real(spec, args, ctx, work)
        red.endpoints[1] = f"127.0.0.1:{nccl_gpu.free_port()}"   # nothing listens there
        return red

    monkeypatch.setattr(nccl_gpu, "start_servers", one_dead)
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "collnet-servers", "--sizes", "1M")
    assert code == 1
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("collnet-servers: the plugin"))
    assert "the plugin ran sharded, not the reduction servers" in line and "server 2 of 2) cannot be reached" in line
    assert not left_running(tmp_path)


@needs_reducer
def test_a_reducer_that_cannot_start_fails_its_variant_only(standin, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "server_addr", lambda mode, i: "192.0.2.1")   # TEST-NET: not ours, bind refused
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "collnet-servers,net", "--sizes", "1M")
    assert code == 1
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("collnet-servers: reduction server"))
    assert "--bind 192.0.2.1" in line and "exited 1: " in line and "192.0.2.1 failed" in line, line
    doc = assert_outputs(tmp_path / "o", "FAIL")
    assert doc["variants"][1]["results"] and not doc["variants"][1]["error"]
    assert not left_running(tmp_path)


@needs_reducer
def test_the_pace_reaches_every_plugin_rank_and_reducer_but_not_socket(standin, capsys, tmp_path):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "socket,net,collnet-servers",
                      "--pace", "1gbit", "--sizes", "64M")
    assert code == 0, out
    o = tmp_path / "o"
    names = [v["variant"] for v in json.loads((o / "report.json").read_text())["variants"]]
    assert names == ["socket", "net@1gbit", "collnet-servers@1gbit"]
    for name in names:
        for r in (0, 1):
            paced = "standin: paced, CLUSTERTOOL_LINK_RATE=1gbit" in archive_text(o, f"{name}.rank{r}.log")
            assert paced == (name != "socket"), (name, r)
    assert "CLUSTERTOOL_LINK_RATE=1gbit\n" in archive_text(o, "collnet-servers@1gbit.reducers.env")
    assert "CLUSTERTOOL_LINK_RATE" not in archive_text(o, "socket.env")
    assert "B = 125.0 MB/s" in out and "socket is reference only (unpaced)" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("   64M") and "x" in ln and "0.95" in ln)
    assert row.split()[2:5] == ["0.95", "0.181", "1.45"] and row.split()[5] == "1.53x", row   # net, servers, ratio
    assert re.search(r"paced 1gbit: servers busbw / B at 64M +1\.45B +>= 1\.35B +met", out), out


def test_socket_cannot_be_paced(capsys):
    with pytest.raises(SystemExit) as e:
        nccl_gpu.parse_args(["--variants", "socket@1gbit"])
    assert e.value.code == 2 and "NCCL's Socket transport cannot be paced" in capsys.readouterr().err


def test_without_mps_the_proof_says_so_and_goes_on(standin, capsys, tmp_path):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net")
    assert code == 0, out
    assert "MPS off (nvidia-cuda-mps-control not found: the ranks take turns on the GPU)" in out
    assert json.loads((tmp_path / "o" / "report.json").read_text())["mps"].startswith("off (nvidia-cuda-mps")


@pytest.mark.parametrize("ignores_quit", [False, True])
def test_mps_reaches_every_rank_and_is_stopped(standin, mps_on_path, capsys, tmp_path, monkeypatch, ignores_quit):
    if ignores_quit:
        monkeypatch.setenv("STANDIN_MPS_IGNORE_QUIT", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "socket,net")
    assert code == 0, out
    assert "MPS on (control daemon, pipes in /tmp/ct-mps-" in out
    for name in ("socket.rank0.log", "net.rank1.log"):
        assert "standin: MPS control daemon answers at /tmp/ct-mps-" in archive_text(tmp_path / "o", name)
    assert "command: quit" in archive_text(tmp_path / "o", "mps-log/control.log")
    assert ("did not quit: sent SIGTERM" in out) == ignores_quit
    assert not left_running(tmp_path)
    pipe = re.search(r"pipes in (/tmp/ct-mps-\w+)", out).group(1)
    assert not Path(pipe).exists()


def test_mps_that_cannot_start_is_reported_and_the_proof_goes_on(standin, mps_on_path, capsys, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("STANDIN_MPS_FAIL", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net")
    assert code == 0, out
    assert "MPS off (nvidia-cuda-mps-control -d failed, exit 1: standin MPS: the daemon cannot start here" in out


def test_a_cuda_context_that_fails_under_mps_turns_it_off_before_the_ranks(standin, mps_on_path, capsys, tmp_path,
                                                                          monkeypatch):
    """The driver-API check (no libcuda here, so a script standing in for it) fails: MPS stops at once."""
    monkeypatch.setattr(procs, "CTX_PROBE", "import sys; print('cuDevicePrimaryCtxRetain returned CUDA error 805'); "
                                            "sys.exit(1)")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net")
    assert code == 0, out
    assert ("MPS off (the daemon started, but a CUDA context under it failed: cuDevicePrimaryCtxRetain returned "
            "CUDA error 805)") in out
    assert "command: quit" in archive_text(tmp_path / "o", "mps-log/control.log")
    assert "MPS" not in archive_text(tmp_path / "o", "net.rank0.log")
    assert not left_running(tmp_path)


def test_a_cuda_client_that_fails_under_mps_turns_it_off(standin, mps_on_path, capsys, tmp_path, monkeypatch):
    probes = []

    def probe(python, env=None, mps=False):
        probes.append(mps)
        return dict(PREFLIGHT, problem="python3 cannot use torch with CUDA: RuntimeError: MPS client failed") \
            if mps else dict(PREFLIGHT)

    monkeypatch.setattr(nccl_gpu, "preflight", probe)
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net")
    assert code == 0, out
    assert probes == [True, False]
    assert "MPS off (a CUDA client failed under MPS: python3 cannot use torch with CUDA" in out
    assert "standin: no MPS control daemon" not in archive_text(tmp_path / "o", "net.rank0.log")
    assert not left_running(tmp_path)


def test_a_first_variant_that_fails_under_mps_runs_again_without_it(standin, mps_on_path, capsys, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("STANDIN_FAIL_UNDER_MPS", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net,collnet-ring")
    assert code == 0, out
    assert "note: net failed under MPS (rank 0 exited 1: RuntimeError: CUDA error: all CUDA-capable devices are busy" \
        in out
    doc = assert_outputs(tmp_path / "o", "PASS")
    assert doc["mps"].startswith("off (the first variant failed under MPS and ran again without it")
    assert [v["variant"] for v in doc["variants"]] == ["net", "collnet-ring"]
    assert "busy or unavailable" in archive_text(tmp_path / "o", "under-mps/net.rank0.log")
    assert "busy" not in archive_text(tmp_path / "o", "net.rank0.log")
    assert not left_running(tmp_path)


def test_collnet_stats_make_a_table_and_their_absence_is_said(standin, capsys, tmp_path, monkeypatch):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "net,collnet-sharded", "--sizes", "1M")
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("collnet-sharded ") and "256K" in ln)
    assert row.split() == ["collnet-sharded", "sharded", "8", "28", "256K", "5.50", "8", "900", "2101", "3.5"]
    assert archive_text(tmp_path / "o", "collnet-sharded.rank1.stats.jsonl").count("\n") == 1
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert doc["stats"][0]["inflight_mean"] == 5.5 and len(doc["variants"][1]["stats"]) == 2
    monkeypatch.setenv("STANDIN_NO_STATS", "1")
    code, out = proof(capsys, tmp_path / "o2", "--ranks", "2", "--variants", "collnet-sharded", "--sizes", "1M")
    assert code == 0, out
    assert "collnet-sharded no stats (a plugin build that writes none, or no CollNet request)" in out


@needs_reducer
def test_the_training_step_reports_samples_per_second_and_the_servers_ratio(standin, capsys, tmp_path):
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--ddp-seconds", "5",
                      "--variants", "ddp-socket,ddp-net@1gbit,ddp-servers@1gbit")
    assert code == 0, out
    assert "training step: torch DDP (backend nccl), an MLP of 25.2M float32 parameters, batch 32 per rank" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("ddp-") and "->" in ln}
    assert "reference only (unpaced)" in rows["ddp-socket"]
    assert rows["ddp-servers@1gbit"].split()[-1] == "1.53x"
    assert re.search(r"training step: samples/s servers / plugin net \(same pace\) +1\.53x +>= 1\.20x +met", out)
    assert "[ddp-servers@1gbit] NCCL 2.28.9" in out and "plugin algorithm servers" in out
    env = archive_text(tmp_path / "o", "ddp-servers@1gbit.env")
    assert "CLUSTERTOOL_COLLNET_ALGO=servers\n" in env and "NCCL_TUNER_PLUGIN=" in env
    assert "CLUSTERTOOL_REDUCERS=127.0.0.1:" in env and "CLUSTERTOOL_LINK_RATE=1gbit\n" in env
    assert not left_running(tmp_path)


def test_ranks_that_end_training_apart_fail_the_proof(standin, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_DDP_DIVERGE", "1")
    code, out = proof(capsys, tmp_path / "o", "--ranks", "2", "--variants", "ddp-net")
    assert code == 1
    assert "ddp-net: the ranks ended training with different parameters" in out


@needs_reducer
def test_the_full_plan_fits_its_budget_with_every_variant(standin, capsys, tmp_path, monkeypatch):
    """--plan full's 10 variants in 60 s: shares of 4.8 s, ranks stop 2 s before theirs; each MiB takes
    0.05 s, so 4M..64M (6.2 s) cannot all run and sizes stop early; every variant still reports."""
    monkeypatch.setattr(plan, "RANK_MARGIN_S", 2.0)
    monkeypatch.setenv("STANDIN_SECONDS_PER_MB", "0.05")
    began = time.monotonic()
    code = nccl_gpu.main(["--plan", "full", "--mode", "hostid", "--budget", "60", "--ranks", "2",
                          "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert time.monotonic() - began < 60
    assert code == 0, out
    doc = assert_outputs(tmp_path / "o", "PASS")
    assert [v["variant"] for v in doc["variants"]] == [
        "socket", "net", "collnet-sharded", "collnet-ring", "net@1gbit", "collnet-sharded@1gbit",
        "collnet-servers@1gbit", "ddp-socket", "ddp-net@1gbit", "ddp-servers@1gbit"]
    assert all(v["results"] or v["ddp"] for v in doc["variants"])
    assert doc["variants"][0]["stopped_before"], "the first share cannot hold 4M..64M"
    assert {r["size"] for v in doc["variants"][4:7] for r in v["results"]} == {64 << 20}
    assert not left_running(tmp_path)


@needs_reducer
def test_sigterm_in_a_servers_variant_leaves_no_reducer_rank_or_mps(standin, mps_on_path, capsys, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("STANDIN_HANG", "1")
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = nccl_gpu.main(["--mode", "hostid", "--variants", "collnet-servers", "--ranks", "2", "--sizes", "1M",
                              "--out", str(tmp_path / "o")])
    finally:
        timer.cancel()
    out = capsys.readouterr().out
    assert code == 1 and "note: interrupted by SIGTERM" in out
    assert_outputs(tmp_path / "o", "FAIL")
    assert "exiting on SIGTERM" in archive_text(tmp_path / "o", "collnet-servers.reducer1.log")
    assert not left_running(tmp_path)
