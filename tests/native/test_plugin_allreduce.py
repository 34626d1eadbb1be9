"""The plugin's C entry point from Python (ctypes, handles over mpi4py) under real Open MPI
on localhost, with real clustertool-reducer processes: results equal MPI_Allreduce's, the
training workload learns the same with either, and a failing server is one clear line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.native
NATIVE = REPO / "native"
MLP = REPO / "clustertool" / "workloads" / "train_mlp.py"
CHECK = REPO / "tests" / "native" / "mpi_plugin_allreduce_check.py"


@pytest.fixture(scope="module")
def built():
    for tool in ("make", "gcc", "mpicc", "mpirun"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (apt-get install build-essential openmpi-bin libopenmpi-dev)")
    pytest.importorskip("mpi4py", reason="needs mpi4py (the train extra)")
    pytest.importorskip("numpy", reason="needs numpy (the train extra)")
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(NATIVE), "all"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return NATIVE / "build"


class Reducer:
    """A real clustertool-reducer on 127.0.0.1 (port file, log file); stop() checks its exit."""

    def __init__(self, build, folder, name, *args):
        self.port_file = folder / f"{name}.port"
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([str(build / "clustertool-reducer"), "--bind", "127.0.0.1",
                                          "--port-file", str(self.port_file), *args], stderr=log)
        deadline = time.monotonic() + 10
        while not (self.port_file.exists() and self.port_file.read_text().endswith("\n")):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.02)
        self.addr = self.port_file.read_text().strip()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


@pytest.fixture
def reducers(built, tmp_path):
    started = []

    def start(count, *args):
        new = [Reducer(built, tmp_path, f"r{len(started) + i}", *args) for i in range(count)]
        started.extend(new)
        return new

    yield start
    codes = [r.stop() for r in started]
    assert all(code in (0, -signal.SIGKILL) for code in codes), codes
    # a reducer stopped by SIGTERM removes its port file (a SIGKILLed one cannot)
    assert all(not r.port_file.exists() for r, code in zip(started, codes) if code == 0)


def _mpirun(np_, argv, env_extra, timeout=300):
    env = dict(os.environ, CLUSTERTOOL_SOCKET_ADDR="127.0.0.1", PYTHONPATH=str(REPO), **env_extra)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    for name in ("CLUSTERTOOL_SOCKET_ADDR", "PYTHONPATH", *env_extra):
        cmd += ["-x", name]
    return subprocess.run(cmd + argv, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("np_", [2, 3])
def test_plugin_allreduce_equals_mpi_allreduce_for_every_algorithm(reducers, np_):
    servers = reducers(2)
    proc = _mpirun(np_, [sys.executable, str(CHECK), "servers", "sharded", "ring"],
                   {"CLUSTERTOOL_REDUCERS": ",".join(r.addr for r in servers)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["servers"]["algorithm"] == "servers" and report["servers"]["servers"] == 2
    for algo in ("servers", "sharded", "ring"):
        assert report[algo]["algorithm"] == algo
        for name, outcome in report[algo].items():
            if isinstance(outcome, dict):
                assert all(outcome.values()), (algo, name, outcome)
    assert "session" in servers[0].log.read_text()


def _train(np_, how, env_extra, steps=15):
    return _mpirun(np_, [sys.executable, str(MLP), "--steps", str(steps), "--batch", "128", "--hidden", "128",
                         "--allreduce", how], env_extra, timeout=300)


def test_train_mlp_learns_the_same_with_the_plugins_servers_as_with_mpi(reducers):
    servers = reducers(3)
    env = {"CLUSTERTOOL_REDUCERS": ",".join(r.addr for r in servers)}
    runs = {how: _train(3, how, env) for how in ("mpi", "servers")}
    for how, proc in runs.items():
        assert proc.returncode == 0, (how, proc.stderr[-3000:])
    assert "allreduce: mpi" in runs["mpi"].stdout
    assert "allreduce: servers (plugin, 3 reduction servers)" in runs["servers"].stdout
    losses = {how: proc.stdout.split("loss: ")[1].splitlines()[0] for how, proc in runs.items()}
    assert losses["mpi"] == losses["servers"], losses   # same model, same data: same loss to 4 places


def test_train_mlp_with_the_plugin_runs_as_a_single_process(built):
    env = dict(os.environ, PYTHONPATH="", CLUSTERTOOL_SOCKET_ADDR="127.0.0.1")
    env.pop("CLUSTERTOOL_REDUCERS", None)
    proc = subprocess.run([sys.executable, str(MLP), "--steps", "3", "--batch", "64", "--hidden", "32",
                           "--allreduce", "servers"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ranks: 1" in proc.stdout and "allreduce: sharded (plugin)" in proc.stdout


def test_train_mlp_servers_refuses_to_run_mislabelled_when_no_server_answers(reducers):
    dead = reducers(1)[0]
    addr = dead.addr
    dead.stop()
    proc = _train(2, "servers", {"CLUSTERTOOL_REDUCERS": addr, "CLUSTERTOOL_REDUCER_CONNECT_MS": "300"}, steps=2)
    assert proc.returncode != 0
    assert "fell back to sharded" in proc.stderr and "Traceback" not in proc.stderr
    assert addr in proc.stderr   # the plugin's WARN names the server


def test_train_mlp_fails_within_the_io_timeout_when_a_server_is_killed(reducers):
    servers = reducers(2)
    env = {"CLUSTERTOOL_REDUCERS": ",".join(r.addr for r in servers), "CLUSTERTOOL_REDUCER_TIMEOUT_MS": "2000"}
    cmd_env = dict(os.environ, CLUSTERTOOL_SOCKET_ADDR="127.0.0.1", PYTHONPATH=str(REPO), **env)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    for name in ("CLUSTERTOOL_SOCKET_ADDR", "PYTHONPATH", *env):
        cmd += ["-x", name]
    cmd += [sys.executable, str(MLP), "--steps", "100000", "--batch", "64", "--hidden", "512", "--allreduce", "servers"]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cmd_env)
    try:
        deadline = time.monotonic() + 60
        while "session" not in servers[1].log.read_text() or "start" not in servers[1].log.read_text():
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.05)
        time.sleep(1.0)   # training under way
        servers[1].proc.kill()
        killed = time.monotonic()
        out, err = job.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode != 0 and took < 2.0 + 5, (took, err[-2000:])   # io timeout + mpirun's teardown
    assert f"reduction server {servers[1].addr}" in err and "Traceback" not in err, err[-2000:]
