"""Stragglers on a real local cluster: 3 workers and a reduction server, the plugin built and deployed, a `run
--plugin` job of the numpy MLP whose gradients go through the reducer (`--allreduce servers`), node-3's link shaped
to a quarter of the others'.  The reducer's lateness record names node-3's worker: `stragglers JOB` after the job,
`top` while it runs.

The record is the reducer's (native/src/ct_reducer_session.c, CLUSTERTOOL_STRAGGLERS_DIR): until the reducer this
checkout builds writes it, the test is skipped and says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clustertool.plugin.build import REDUCER
from clustertool.workloads import node_python
from tests.conftest import REPO, run_cli
from tests.local.conftest import module_cluster
from tests.local.test_watch import _shape

pytestmark = pytest.mark.local
MLP = REPO / "clustertool" / "workloads" / "train_mlp.py"
RATE_MBIT = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("numpy", reason="needs numpy (the train extra)")
    gen = module_cluster(tmp_path_factory, 3, "sl", "--reduction-servers", "1", "--link-rate", f"{RATE_MBIT}mbit")
    name, env = next(gen)
    try:
        built = run_cli("plugin", "build", "-c", name, "--json", env=env, timeout=900)
        assert built.returncode == 0, built.stderr[-2000:]
        reducer = Path(json.loads(built.stdout)["dir"]) / REDUCER   # the build this cluster deploys
        if b"CLUSTERTOOL_STRAGGLERS_DIR" not in reducer.read_bytes():
            pytest.skip(f"{reducer} writes no lateness record yet (the reducer's straggler record is not applied to "
                        "native/)")
        deployed = run_cli("plugin", "deploy", "-c", name, env=env, timeout=300)
        assert deployed.returncode == 0, deployed.stderr
        yield name, env
    finally:
        next(gen, None)  # down, and the leftover check


def test_the_reducer_names_the_worker_behind_the_slow_link(cluster):
    name, env = cluster
    python = node_python()
    path = [w for w in python if w.startswith("PYTHONPATH=")]
    command = [w for w in python if w != "env" and not w.startswith("PYTHONPATH=")]
    _shape(name, env, 3, f"{RATE_MBIT // 4}mbit")
    try:
        started = run_cli("run", "-c", name, "--plugin", "--json", *[f for p in path for f in ("-x", p)], "--",
                          *command, str(MLP), "--steps", "150", "--batch", "64", "--hidden", "256",
                          "--allreduce", "servers", env=env, timeout=120)
        assert started.returncode == 0, started.stderr
        job_id = json.loads(started.stdout)["id"]
        deadline, seen = time.monotonic() + 240, None
        while seen is None:   # top, while the job runs: the reducer's records come once a second
            view = json.loads(run_cli("top", "-c", name, "--once", "--json", "--job", job_id, env=env,
                                      timeout=120).stdout)
            late = (view["jobs"][0].get("stragglers") if view["jobs"] else None) or {}
            if late.get("flagged"):
                seen = late
            assert time.monotonic() < deadline, view["jobs"]
        done = run_cli("logs", "-c", name, "-f", job_id, env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    finally:
        _shape(name, env, 3, f"{RATE_MBIT}mbit")
    worker = next(w for w in seen["workers"] if w["worker"] == seen["flagged"][0])
    assert seen["flagged"] == [worker["worker"]] and worker["node"] == "node-3", seen
    report = json.loads(run_cli("stragglers", "-c", name, job_id, "--json", env=env, timeout=120).stdout)
    assert report["source"] == "servers" and report["stragglers"] == [worker["worker"]]
    first = report["workers"][0]
    assert first["node"] == "node-3" and first["straggler"] and first["p50_ms"] >= 1.0
    table = run_cli("stragglers", "-c", name, job_id, env=env, timeout=120).stdout
    assert f"job {job_id}: worker {first['worker']} straggler(s)" in table and "node-3" in table
