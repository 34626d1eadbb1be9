"""The GPU proof's namespace mode for real (root): one namespace per rank on shaped veth
links, ranks meeting at rank 0's address, the reduction servers (the real clustertool-reducer)
each in a namespace of its own, everything removed afterwards; and the fallback to loopback when
the kernel refuses a namespace link or `ip`/`tc` are missing. The ranks are the stand-in of
tests/cli/nccl_gpu_standin.py (no GPU or NCCL here); it binds and connects on the 10.213.249.0/24
addresses, which exist only inside the namespaces this mode builds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402

pytestmark = pytest.mark.local
STANDIN = REPO / "tests" / "cli" / "nccl_gpu_standin.py"
REDUCER = REPO / "native" / "build" / plan.REDUCER


@pytest.fixture
def proof_env(monkeypatch, tmp_path):
    build = tmp_path / "native" / "build"
    build.mkdir(parents=True)
    for lib in (plan.NET_LIB, plan.TUNER_LIB):
        (build / lib).write_bytes(b"")
    if REDUCER.is_file():
        (build / plan.REDUCER).symlink_to(REDUCER)
    monkeypatch.setattr(plan, "WORKER", STANDIN)
    monkeypatch.setattr(plan, "DDP_WORKER", STANDIN)
    monkeypatch.setattr(plan, "NATIVE", tmp_path / "native")
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python, env=None, mps=False: {"tools": {}, "gpu": "stand-in"})
    monkeypatch.setattr(nccl_gpu, "build_plugin", lambda build, prebuilt=False: "prebuilt (test)")
    created = []
    real_run = nccl_gpu._run

    def spy(cmds, check=True):
        created.extend(c[3] for c in cmds if c[:3] == ["ip", "netns", "add"])
        return real_run(cmds, check)

    monkeypatch.setattr(nccl_gpu, "_run", spy)
    return created


def assert_none_left(names: list[str]) -> None:
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in names if n in left], f"namespaces left behind: {left}"


def test_netns_mode_runs_ranks_on_shaped_links_and_removes_them(proof_env, tmp_path, capsys):
    code = nccl_gpu.main(["--mode", "netns", "--ranks", "3", "--rate", "200mbit", "--sizes", "1M",
                          "--variants", "socket,collnet-sharded", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "each rank in its own network namespace on a shaped veth link, links 200mbit" in out
    assert len(proof_env) == 4 and proof_env[0].endswith("sw")
    assert_none_left(proof_env)


def test_a_kernel_that_refuses_veth_falls_back_to_loopback_and_cleans_up(proof_env, monkeypatch, tmp_path, capsys):
    """As on a GPU machine whose kernel lacks veth: the bridge namespace is made, the link is refused."""
    def refused(tag, n, bits, servers=0):
        sw = plan.netns_names(tag, n)[0]
        return [["ip", "netns", "add", sw], ["ip", "-n", sw, "link", "add", "v0", "type", "ct-no-such-kind"]]

    monkeypatch.setattr(plan, "netns_setup_argvs", refused)
    code = nccl_gpu.main(["--ranks", "2", "--sizes", "1M", "--variants", "socket,collnet-ring",
                          "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ranks on loopback with distinct NCCL_HOSTID (namespace/tc setup failed: ip -n" in out
    assert "links unshaped" in out
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert doc["mode"] == "hostid" and doc["verdict"] == "PASS"
    assert len(proof_env) == 1
    assert_none_left(proof_env)


def test_without_ip_and_tc_the_proof_runs_on_loopback(proof_env, monkeypatch, tmp_path, capsys):
    real_which = nccl_gpu.shutil.which
    monkeypatch.setattr(nccl_gpu.shutil, "which", lambda name: None if name in ("ip", "tc") else real_which(name))
    code = nccl_gpu.main(["--ranks", "2", "--sizes", "1M", "--variants", "net,collnet-sharded",
                          "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ranks on loopback with distinct NCCL_HOSTID (no ip/tc)" in out
    assert proof_env == []


@pytest.mark.skipif(not REDUCER.is_file(), reason="needs the reducer: make -C native plugins")
def test_netns_mode_puts_each_reducer_in_a_namespace_of_its_own(proof_env, tmp_path, capsys):
    code = nccl_gpu.main(["--mode", "netns", "--ranks", "2", "--rate", "200mbit", "--sizes", "1M", "--pace", "1gbit",
                          "--variants", "collnet-servers,ddp-servers", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0, out
    tag = proof_env[0][:-2]     # the bridge namespace, <tag>sw, is made first
    assert set(proof_env) == {f"{tag}{n}" for n in ("sw", "r0", "r1", "s0", "s1")}
    assert "reducer 0 (10.213.249.30:" in out and "reducer 1 (10.213.249.31:" in out
    assert out.count("plugin algorithm servers") == 2
    assert_none_left(proof_env)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"reducers left running: {left}"
