"""`up --monitoring` on real local clusters: Prometheus answers for every node's exporter, `status` says it runs,
`stop` + `start` bring it back (the nodes' processes ended with their PID namespaces), `down` leaves no process;
machines that stay (the static provider adopting a local cluster's nodes) get their stack stopped by `down`."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from clustertool.core import state
from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers, monitoring_processes

pytestmark = pytest.mark.local


def up_query(name: str, env: dict, expect: int, seconds: float = 120) -> list[dict]:
    """`up{job="node"}` once every node's exporter answers Prometheus (it scrapes every 2 s here)."""
    deadline = time.monotonic() + seconds
    while True:
        proc = run_cli("metrics", "query", 'up{job="node"}', "-c", name, "--json", env=env, timeout=120)
        result = json.loads(proc.stdout)["result"] if proc.returncode == 0 else []
        if len(result) == expect and all(s["value"][1] == "1" for s in result):
            return result
        assert time.monotonic() < deadline, proc.stdout + proc.stderr
        time.sleep(1)


def test_up_monitoring_starts_the_stack_start_brings_it_back_and_down_leaves_nothing(ct_env):
    name = unique("um")
    up = run_cli("up", "--provider", "local", "--nodes", "2", "--name", name, "--monitoring", "--scrape-interval",
                 "2s", "--json", env=ct_env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        doc = json.loads(up.stdout)
        assert doc["monitoring"]["problems"] == [] and doc["cluster"]["monitoring"]["scrape_interval"] == "2s"
        assert doc["monitoring"]["nodes"]["node-1"]["prometheus"].startswith("running")
        assert sorted(s["metric"]["node"] for s in up_query(name, ct_env, 2)) == ["node-1", "node-2"]
        status = run_cli("status", "-c", name, env=ct_env)
        assert "monitoring: on: Prometheus on node-1 (127.0.0.1:9090), every 2s" in status.stdout, status.stdout
        assert run_cli("stop", "-c", name, env=ct_env, timeout=300).returncode == 0
        assert monitoring_processes(name) == []   # the nodes' processes ended with them
        started = run_cli("start", "-c", name, env=ct_env, timeout=300)
        assert started.returncode == 0, started.stderr
        assert "monitoring: started again after start" in started.stderr + started.stdout
        up_query(name, ct_env, 2)
        assert len(monitoring_processes(name)) >= 4   # two node exporters, clustertool's exporter, Prometheus
    finally:
        down = run_cli("down", "-c", name, "--yes", env=ct_env, timeout=300)
    assert down.returncode == 0, down.stderr
    assert local_leftovers(name) == []


def test_down_of_adopted_machines_stops_the_stack_they_keep(ct_env, local_cluster):
    base = local_cluster(2)
    adopted = unique("ua")
    hosts = ",".join(n.address for n in state.load(base).ordered_nodes())
    up = run_cli("up", "--provider", "static", "--hosts", hosts, "--user", "root", "--key",
                 str(state.ClusterPaths(base).key), "--name", adopted, "--monitoring", "--scrape-interval", "2s",
                 env=ct_env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        up_query(adopted, ct_env, 2)
        assert len(monitoring_processes(adopted)) >= 4
    finally:
        down = run_cli("down", "-c", adopted, "--yes", env=ct_env, timeout=300)
    assert down.returncode == 0, down.stderr
    assert "monitoring: stopped on every node" in down.stdout + down.stderr
    assert monitoring_processes(adopted) == []   # the machines stay up; nothing of the stack does
    assert run_cli("exec", "-c", base, "--", "true", env=ct_env).returncode == 0


STEPS = r"""
import sys, time
for step in range(int(sys.argv[1])):
    time.sleep(0.25)
    print(f"step {step} loss {1.0 / (step + 1):.4f} time 250.0ms", flush=True)
"""


def watch_processes(name: str, nodes: int) -> list[str]:
    """The watch's processes (recorder hub, samplers) in the cluster's namespaces."""
    from clustertool.providers.local import net, sysops

    found = []
    for ns, pids in sysops.pids_in_netns([net.netns_name(name, i) for i in range(1, nodes + 1)]).items():
        for pid in pids:
            try:
                comm = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                continue
            if comm in ("ct-watch", "ct-watchnode"):
                found.append(f"{ns} {pid} {comm}")
    return found


def test_every_job_is_recorded_and_run_follow_ends_with_its_report(ct_env, local_cluster, tmp_path, request):
    """No monitoring: the recorder started with the job samples its nodes; `run --follow` writes the report and says
    where; `report JOB` draws the same record; nothing of the recorder stays; --no-record starts none."""
    name = local_cluster(2)
    folder = Path("/var/tmp") / f"ct-rec-{name}"   # the nodes share this machine's /var/tmp
    folder.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(folder))
    (folder / "steps.py").write_text(STEPS)
    done = run_cli("run", "-c", name, "--launcher", "process", "--follow", "--", "python3", f"{folder}/steps.py",
                   "60", env=ct_env, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next((x for x in done.stderr.splitlines() if x.startswith("report: ")), None)
    assert line is not None, done.stderr
    html = line.split()[1]
    assert html.endswith(".html") and f"clusters/{name}/reports/" in html and os.path.getsize(html) > 5000
    job_id = os.path.basename(html)[:-5]
    drawn = run_cli("report", "-c", name, job_id, "-o", str(tmp_path / "again"), "--json", env=ct_env, timeout=120)
    run = json.loads(drawn.stdout)["run"]
    assert run["nodes"] == ["node-1", "node-2"] and len(run["t"]) >= 2
    assert any(v is not None and v > 1 for v in run["steps"]["node-2"]), run["steps"]   # ~4 steps/s per rank
    deadline = time.monotonic() + 20
    while watch_processes(name, 2) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert watch_processes(name, 2) == []
    quiet = run_cli("run", "-c", name, "--no-record", "--launcher", "process", "--follow", "--", "python3",
                    f"{folder}/steps.py", "4", env=ct_env, timeout=300)
    assert quiet.returncode == 0 and "report: " not in quiet.stderr, quiet.stderr


def test_the_python_api_watches_as_the_commands_do(ct_env, tmp_path, request):
    """Cluster.up(monitoring=...), top(), metrics_query(), monitoring(None/False), Job.report(), Job.stragglers():
    the same data the commands print."""
    from clustertool import Cluster

    folder = Path("/var/tmp") / f"ct-api-{unique('w')}"
    folder.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(folder))
    (folder / "steps.py").write_text(STEPS)
    name = unique("uw")
    with Cluster.up(provider="local", nodes=2, name=name, monitoring={"scrape_interval": "2s"}) as cluster:
        assert cluster.record.monitoring["scrape_interval"] == "2s"
        view = cluster.top(samples=1)
        assert [n["name"] for n in view["nodes"]] == ["node-1", "node-2"] and view["cluster"] == name
        assert all(n["state"] == "ok" for n in view["nodes"])
        deadline = time.monotonic() + 120
        while len(cluster.metrics_query('up{job="node"} == 1')["result"]) < 2:
            assert time.monotonic() < deadline, cluster.monitoring(None).to_dict()
            time.sleep(1)
        job = cluster.run(["python3", str(folder / "steps.py"), "40"], launcher="process")
        assert job.wait(timeout=180) == 0
        files = job.report(tmp_path / "run")
        assert files.html == str(tmp_path / "run.html") and os.path.getsize(files.html) > 5000
        late = job.stragglers()
        assert late.source == "none" and "ran without reduction servers" in late.note
        status = cluster.monitoring(None)
        assert status.nodes["node-1"]["prometheus"].startswith("running") and status.problems == []
        off = cluster.monitoring(False)
        assert off.problems == [] and monitoring_processes(name) == []
        assert cluster.refresh().record.monitoring is None
    assert local_leftovers(name) == []
