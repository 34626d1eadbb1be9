"""Reduction servers on a real local cluster: 2 workers + 2 servers (sshd in namespaces), the real
clustertool-reducer started and stopped per `run --plugin` job, kill, a dead server, doctor."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import run_cli
from tests.local import nodehost
from tests.local.conftest import module_cluster, stop_node_sshd

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """2 workers and 2 reduction servers, the plugin (with the reducer) built and deployed."""
    gen = module_cluster(tmp_path_factory, 2, "rs", "--reduction-servers", "2")
    name, env = next(gen)
    try:
        built = run_cli("plugin", "build", "-c", name, env=env, timeout=900)
        assert built.returncode == 0, built.stderr[-2000:]
        deployed = run_cli("plugin", "deploy", "-c", name, env=env)
        assert deployed.returncode == 0, deployed.stderr
        yield name, env
    finally:
        next(gen, None)  # down, and the leftover check


def cli(cluster, command, *args, timeout=120):
    name, env = cluster
    words = command.split()  # "plugin deploy", "bench allreduce": -c goes after the command, before `--`
    return run_cli(*words, "-c", name, *args, env=env, timeout=timeout)


def reducers_on(cluster, node) -> list[str]:
    """The reducer processes on a server (its own PID namespace: only that node's processes)."""
    proc = cli(cluster, "exec", "-n", node, "--no-live", "--", "pgrep -a -x clustertool-red || true")
    return [ln for ln in proc.stdout.splitlines() if "clustertool-reducer" in ln]


def start(cluster, *cmd, extra=()):
    proc = cli(cluster, "run", "--plugin", "--json", *extra, "--", *cmd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def workers_gate(cluster) -> nodehost.Gate:
    """A gate for a job on the workers: it runs until the test opens it."""
    name, env = cluster
    return nodehost.Gate(env, name, ["node-1", "node-2"])


def wait_end(cluster, job_id, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in json.loads(cli(cluster, "jobs", "--json").stdout)["jobs"]}
        if jobs[job_id]["state"] != "running":
            return jobs[job_id]
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still running after {timeout}s")


def test_servers_have_their_role_and_stay_out_of_hostfiles(cluster):
    name, env = cluster
    nodes = {n["node"]: n for n in json.loads(cli(cluster, "status", "--json").stdout)["nodes"]}
    assert {n: v["role"] for n, v in nodes.items()} == {
        "node-1": "leader", "node-2": "member", "server-1": "server", "server-2": "server"}
    hostfile = open(os.path.join(env["CLUSTERTOOL_HOSTFILE_DIR"], name)).read().split()
    assert [w for w in hostfile if not w.startswith("slots")] == [nodes["node-1"]["address"],
                                                                   nodes["node-2"]["address"]]
    on_leader = cli(cluster, "exec", "-n", "leader", "--no-live", "--", "cat ~/hostfile").stdout
    assert nodes["server-1"]["address"] not in on_leader and nodes["node-2"]["address"] in on_leader
    names = cli(cluster, "exec", "-n", "servers", "--no-live", "--", "hostname")
    assert names.returncode == 0 and sorted(ln for ln in names.stdout.splitlines() if not ln.startswith("----")) \
        == ["server-1", "server-2"]
    # a job's ranks run on the workers only, and a server asked for as a rank is refused
    job = start(cluster, "hostname")
    assert job["nodes"] == ["node-1", "node-2"] and job["np"] == 2 and job["servers"] == ["server-1", "server-2"]
    refused = cli(cluster, "run", "--nodes", "node-1,server-2", "--", "true")
    assert refused.returncode == 2 and "server-2 is a reduction server" in refused.stderr
    wait_end(cluster, job["id"])


def test_run_plugin_gives_each_job_its_own_reducers_and_stops_them_when_it_ends(cluster):
    gate = workers_gate(cluster)  # a runs until b has started and the test has looked
    a = start(cluster, "sh", "-c", f"echo REDUCERS=$CLUSTERTOOL_REDUCERS; {gate.wait}")
    b = start(cluster, "sh", "-c", "echo REDUCERS=$CLUSTERTOOL_REDUCERS", extra=("--allow-concurrent",))
    assert len(reducers_on(cluster, "server-1")) >= 1
    gate.open()
    lists = {}
    for job in (a, b):
        wait_end(cluster, job["id"])
        logs = cli(cluster, "logs", job["id"]).stdout
        lists[job["id"]] = next(ln.split("REDUCERS=")[1] for ln in logs.splitlines() if "REDUCERS=" in ln).split(",")
    status = {n["node"]: n["address"] for n in json.loads(cli(cluster, "status", "--json").stdout)["nodes"]}
    for endpoints in lists.values():  # server order, each server's own address
        assert [e.split(":")[0] for e in endpoints] == [status["server-1"], status["server-2"]]
    assert set(lists[a["id"]]).isdisjoint(lists[b["id"]]), "two concurrent jobs must not share a reducer port"
    assert reducers_on(cluster, "server-1") == [] and reducers_on(cluster, "server-2") == []


def test_kill_stops_the_reducers_on_the_servers_and_says_so(cluster):
    job = start(cluster, *workers_gate(cluster).command)  # never opened: the job runs until `kill`
    assert len(reducers_on(cluster, "server-2")) == 1
    proc = cli(cluster, "kill", job["id"], "--grace", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    by_node = {n["node"]: n for n in result["nodes"]}
    assert result["clean"] and set(by_node) == {"node-1", "node-2", "server-1", "server-2"}
    assert by_node["server-1"]["signaled"] and by_node["server-1"]["remaining"] == []
    assert reducers_on(cluster, "server-1") == [] and reducers_on(cluster, "server-2") == []


def test_a_server_that_dies_during_the_job_is_named_in_its_log_and_in_jobs(cluster):
    gate = workers_gate(cluster)  # the job runs until its server is dead (a `sleep 4` ended first on a busy machine)
    job = start(cluster, *gate.command)
    killed = cli(cluster, "exec", "-n", "server-2", "--no-live", "--",
                 f"kill -9 $(cat ~/.clustertool/jobs/{job['id']}/reducer.pid)")
    assert killed.returncode == 0, killed.stderr
    gate.open()
    ended = wait_end(cluster, job["id"])
    assert ended["servers_lost"] == ["server-2"]
    assert "reduction server server-2" in cli(cluster, "logs", job["id"]).stdout
    table = cli(cluster, "jobs").stdout
    assert "reduction server server-2 gone" in table
    assert reducers_on(cluster, "server-1") == []


def test_bench_allreduce_servers_is_correct_and_beside_ring(cluster):
    proc = cli(cluster, "bench allreduce", "--algo", "servers,ring", "--sizes", "64K:1M", "--iters", "2",
               "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["rows"]
    assert {r["algo"] for r in rows} == {"servers", "ring"} and len(rows) == 10
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in rows)
    assert reducers_on(cluster, "server-1") == []


def test_plugin_check_runs_servers_beside_the_rest_on_the_workers_and_stops_the_reducers(cluster):
    """No GPU here: the collnet_bench stand-in (not NCCL), on the 2 workers, with this job's reducers."""
    proc = cli(cluster, "plugin check", "--sizes", "64K:128K", "-n", "2", "-w", "1", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["mode"] == "standin" and doc["ranks"] == 2 and doc["servers"] == 2 and doc["ok"]
    assert {(r["algo"], r["size"]) for r in doc["rows"]} == {
        (a, s) for a in ("servers", "sharded", "ring", "mpi") for s in (65536, 131072)}
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in doc["rows"])
    assert any(e.startswith("# reduction servers: ") for e in doc["evidence"]), doc["evidence"]
    assert reducers_on(cluster, "server-1") == [] and reducers_on(cluster, "server-2") == []


def test_doctor_reports_an_unreachable_server_with_its_fix_and_reboot_brings_it_back(cluster):
    name, env = cluster
    stop_node_sshd(name, 4)  # server-2: the 4th namespace
    proc = cli(cluster, "doctor", "--check", "reach", "--json")
    report = json.loads(proc.stdout)
    findings = [f for c in report["checks"] for f in c["findings"] if f["severity"] == "error"]
    assert proc.returncode == 1 and [f["node"] for f in findings] == ["server-2"]
    assert "reduction server not reachable" in findings[0]["message"]
    assert "clustertool reboot --nodes server-2" in findings[0]["fix"]
    refused = cli(cluster, "run", "--plugin", "--", "true")
    assert refused.returncode != 0 and "server-2" in refused.stderr
    assert reducers_on(cluster, "server-1") == [], "a job that could not start leaves no reducer behind"
    assert cli(cluster, "reboot", "--nodes", "server-2", "--yes", timeout=120).returncode == 0
    proc = cli(cluster, "doctor", "--check", "reach,sameness", "--json")
    assert proc.returncode == 0, proc.stdout
