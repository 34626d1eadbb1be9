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


def _synthetic():
    import importlib.util

    spec = importlib.util.spec_from_file_location("synthetic_benchmark", workloads.DIR / "synthetic_benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_benchmark_takes_gpu_or_cpu_defaults_by_device():
    sb = _synthetic()
    gpu = sb._resolve(sb._args([]), cuda_available=True)
    assert (gpu.device, gpu.model, gpu.batch_size, gpu.image_size) == ("cuda", "resnet50", 64, 224)
    cpu = sb._resolve(sb._args([]), cuda_available=False)
    assert (cpu.device, cpu.model, cpu.batch_size, cpu.image_size, cpu.iters) == ("cpu", "tiny", 16, 32, 3)
    mine = sb._resolve(sb._args(["--device", "cpu", "--batch-size", "4", "--model", "resnet18"]), cuda_available=True)
    assert (mine.device, mine.batch_size, mine.model) == ("cpu", 4, "resnet18"), "explicit flags win"


def test_synthetic_benchmark_refuses_what_cannot_run():
    sb = _synthetic()
    with pytest.raises(SystemExit, match="torch sees no GPU"):
        sb._resolve(sb._args(["--device", "cuda"]), cuda_available=False)
    with pytest.raises(SystemExit, match="horovod needs GPUs"):
        sb._resolve(sb._args(["--device", "cpu", "--backend", "horovod"]), cuda_available=False)


def test_synthetic_benchmark_help_and_arguments_need_no_torch():
    code = ("import sys, importlib.util; sys.modules['torch'] = None; "   # any torch import now fails
            f"spec = importlib.util.spec_from_file_location('sb', {str(workloads.DIR / 'synthetic_benchmark.py')!r}); "
            "sb = importlib.util.module_from_spec(spec); spec.loader.exec_module(sb); "
            "print(sb._resolve(sb._args([]), cuda_available=False).model)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "tiny", proc.stderr
