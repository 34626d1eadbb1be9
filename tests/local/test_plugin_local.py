"""plugin build/deploy/status and bench allreduce on a real local cluster (sshd in namespaces)."""

from __future__ import annotations

import json

import pytest

from clustertool import Cluster
from tests.conftest import run_cli

pytestmark = pytest.mark.local

LIB = "/root/.clustertool/lib"


def _status(name, env):
    proc = run_cli("plugin", "status", "-c", name, "--json", env=env)
    return proc.returncode, {r["node"]: r for r in json.loads(proc.stdout)}


def test_deploy_all_or_nothing_and_status_spots_a_changed_node(local_cluster, ct_env):
    name = local_cluster(3)
    assert run_cli("plugin", "build", "-c", name, env=ct_env, timeout=600).returncode == 0
    proc = run_cli("plugin", "deploy", "-c", name, env=ct_env)
    assert proc.returncode == 0, proc.stderr
    code, rows = _status(name, ct_env)
    assert code == 0 and all(r["matches"] for r in rows.values()) and len(rows) == 3
    assert len({r["sha256"] for r in rows.values()}) == 1

    # a node whose library changed is named by status
    run_cli("exec", "-c", name, "-n", "node-2", "--", f"echo x >> {LIB}/libnccl-net-clustertool.so", env=ct_env)
    code, rows = _status(name, ct_env)
    assert code == 1 and not rows["node-2"]["matches"] and rows["node-1"]["matches"]
    changed = rows["node-2"]["sha256"]

    # node-3 cannot stage: the deploy stops before touching any node (node-2 keeps its bytes)
    run_cli("exec", "-c", name, "-n", "node-3", "--", f"rm -rf {LIB} && touch {LIB}", env=ct_env)
    proc = run_cli("plugin", "deploy", "-c", name, env=ct_env)
    assert proc.returncode == 1 and "node-3" in proc.stderr and "before changing any node" in proc.stderr
    code, rows = _status(name, ct_env)
    assert rows["node-2"]["sha256"] == changed
    leftovers = run_cli("exec", "-c", name, "--", f"ls -a {LIB} 2>/dev/null | grep -c staging || true", env=ct_env)
    assert "1" not in leftovers.stdout.split(), "staging folders must be removed everywhere"

    run_cli("exec", "-c", name, "-n", "node-3", "--", f"rm -f {LIB}", env=ct_env)
    assert run_cli("plugin", "deploy", "-c", name, env=ct_env).returncode == 0
    code, rows = _status(name, ct_env)
    assert code == 0 and all(r["matches"] for r in rows.values())
    env_lines = run_cli("plugin", "env", "-c", name, env=ct_env).stdout
    assert "NCCL_NET_PLUGIN=clustertool" in env_lines and "NCCL_COLLNET_ENABLE=1" in env_lines


def test_leader_build_deploys_and_bench_allreduce_is_correct(local_cluster, ct_env, tmp_path):
    name = local_cluster(3)
    built = run_cli("plugin", "build", "--on", "leader", "-c", name, "--json", env=ct_env, timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    build = json.loads(built.stdout)
    assert build["built_on"] == "node-1" and build["version"] and len(build["sha256"]) == 64
    assert run_cli("plugin", "deploy", "-c", name, env=ct_env).returncode == 0
    code, rows = _status(name, ct_env)
    assert code == 0 and {r["sha256"] for r in rows.values()} == {build["sha256"]}
    table = tmp_path / "tuner.csv"
    proc = run_cli("bench", "allreduce", "-c", name, "--sizes", "64K:256K", "-n", "2", "--json",
                   "--tuner-csv", str(table), env=ct_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["rows"]
    assert {r["algo"] for r in rows} == {"sharded", "ring", "mpi"}
    assert {r["size"] for r in rows} == {65536, 131072, 262144}
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in rows)
    assert table.read_text().startswith("collective,min_bytes,max_bytes")
    # the same benchmark from Python: Cluster.bench_allreduce, the rows the command prints with --json
    result = Cluster.load(name).bench_allreduce(sizes="64K", algo=["ring", "mpi"], iters=2)
    assert result.ok and {(r.algo, r.size) for r in result.rows} == {("ring", 65536), ("mpi", 65536)}
    assert result.to_dict()["exit_code"] == 0 and all(r.busbw > 0 for r in result.rows)
    # the table goes out with the plugin and the job environment points at it
    assert run_cli("plugin", "deploy", "-c", name, "--tuner-table", str(table), env=ct_env).returncode == 0
    assert f"CLUSTERTOOL_TUNER_CONFIG={LIB}/tuner.csv" in run_cli("plugin", "env", "-c", name, env=ct_env).stdout


def test_plugin_check_without_gpus_says_so_and_the_standin_is_correct(local_cluster, ct_env):
    """The issue's done-when: build, deploy and `plugin check` on 4 local nodes, which have no GPU: one
    line says so, the collnet_bench stand-in runs (as a clustertool job) with #wrong = 0, and doctor's
    plugin-nccl check is skipped for the same reason. NCCL itself cannot run here (no GPU)."""
    name = local_cluster(4)
    assert run_cli("plugin", "build", "-c", name, env=ct_env, timeout=600).returncode == 0
    assert run_cli("plugin", "deploy", "-c", name, env=ct_env).returncode == 0
    args = ("plugin", "check", "-c", name, "--sizes", "64K:256K", "-n", "2", "-w", "1")
    proc = run_cli(*args, env=ct_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    assert out[0] == "no GPU on node-[1-4]: running the collnet_bench stand-in (not NCCL)"
    assert out[-1] == "ok: #wrong 0; NCCL did not run (no GPU)"

    doc = json.loads(run_cli(*args, "--json", env=ct_env, timeout=600).stdout)
    assert doc["mode"] == "standin" and doc["nccl"] is None and doc["ok"] and doc["wrong"] == 0
    assert doc["ranks"] == 4 and doc["evidence"][0].startswith("# collnet_bench: 4 ranks, plugin " + LIB)
    assert {(r["algo"], r["size"]) for r in doc["rows"]} == {
        (a, s) for a in ("sharded", "ring", "mpi") for s in (65536, 131072, 262144)}
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in doc["rows"])
    jobs = json.loads(run_cli("jobs", "-c", name, "--json", env=ct_env).stdout)["jobs"]
    assert [j["name"] for j in jobs].count("plugin-check") == 2

    proc = run_cli("doctor", "-c", name, "--check", "plugin-nccl", "--json", env=ct_env)
    check = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "plugin-nccl")
    assert proc.returncode == 0 and (check["status"], check["skipped"]) == ("skipped", "no GPU")

    # a node whose library changed since the deploy: one error line, nothing runs
    run_cli("exec", "-c", name, "-n", "node-2", "--", f"echo x >> {LIB}/libnccl-net-clustertool.so", env=ct_env)
    proc = run_cli(*args, env=ct_env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [
        "error: the plugin on the nodes is not the one deployed: node-2: libnccl-net-clustertool.so differs"]
