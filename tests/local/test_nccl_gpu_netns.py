"""The GPU proof's namespace mode for real (root): one namespace per rank on shaped veth
links, ranks meeting at rank 0's address, everything removed afterwards. The ranks are the
stand-in of tests/cli/nccl_gpu_standin.py (no GPU or NCCL here); it binds and connects on the
10.213.249.0/24 addresses, which exist only inside the namespaces this mode builds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402

pytestmark = pytest.mark.local
STANDIN = REPO / "tests" / "cli" / "nccl_gpu_standin.py"


def test_netns_mode_runs_ranks_on_shaped_links_and_removes_them(monkeypatch, tmp_path, capsys):
    build = tmp_path / "native" / "build"
    build.mkdir(parents=True)
    for lib in (plan.NET_LIB, plan.TUNER_LIB):
        (build / lib).write_bytes(b"")
    monkeypatch.setattr(plan, "WORKER", STANDIN)
    monkeypatch.setattr(plan, "NATIVE", tmp_path / "native")
    monkeypatch.setattr(nccl_gpu, "preflight", lambda python: None)
    monkeypatch.setattr(nccl_gpu, "build_plugin", lambda build: None)
    created = []
    real_run = nccl_gpu._run

    def spy(cmds, check=True):
        created.extend(c for c in cmds if c[:3] == ["ip", "netns", "add"])
        return real_run(cmds, check)

    monkeypatch.setattr(nccl_gpu, "_run", spy)
    code = nccl_gpu.main(["--mode", "netns", "--ranks", "3", "--rate", "200mbit", "--sizes", "1M",
                          "--variants", "socket,collnet-sharded"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "each rank in its own network namespace on a shaped veth link, links 200mbit" in out.splitlines()[0]
    names = [c[3] for c in created]
    assert len(names) == 4 and names[0].endswith("sw")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in names if n in left], f"namespaces left behind: {left}"
