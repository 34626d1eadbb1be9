"""The shipped CPU workload runs, learns, and prints a figure bench scaling reads; node_python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clustertool import workloads
from clustertool.bench import scaling

pytestmark = pytest.mark.unit

SCRIPT = str(workloads.DIR / "train_mlp.py")


def _run(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_train_mlp_single_process_prints_a_readable_throughput_and_learns(tmp_path):
    pytest.importorskip("numpy", reason="the workload needs numpy (the train extra)")
    _run("--make-dataset", str(tmp_path), "--samples", "2000")
    out = _run("--data", str(tmp_path / "train.npz"), "--steps", "30", "--batch", "256", "--hidden", "64",
               "--lr", "0.1")
    assert scaling.parse_throughput(out).value > 0
    first, last = (float(x) for x in out.split("loss: ")[1].split()[0::2][:2])
    assert last < first


def test_train_mlp_rejects_a_batch_larger_than_its_shard(tmp_path):
    pytest.importorskip("numpy", reason="the workload needs numpy (the train extra)")
    _run("--make-dataset", str(tmp_path), "--samples", "100")
    proc = subprocess.run([sys.executable, SCRIPT, "--data", str(tmp_path / "train.npz"), "--batch", "512"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "fewer than --batch 512" in proc.stderr


def test_node_python_is_this_interpreter_outside_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "executable", "/opt/venv/bin/python")
    assert workloads.node_python() == ["/opt/venv/bin/python"]


def test_node_python_avoids_an_interpreter_hidden_under_home(monkeypatch, tmp_path):
    home = tmp_path / "home"
    exe = home / ".pyenv" / "bin" / "python3"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(sys, "executable", str(exe))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = [p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)]
    result = workloads.node_python()
    if system:
        assert result[0] == "env" and result[1].startswith("PYTHONPATH=") and result[2] == system[0]
    else:
        assert result == [str(exe)]
