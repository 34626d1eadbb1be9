"""The Python API on a real local cluster: the same results the CLI prints, jobs, errors, Fabric."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from clustertool import Cluster, StateError, ToolError, UsageError
from clustertool.core import state
from clustertool.core.jobpaths import JOBS_DIR
from tests.conftest import REPO, run_cli, unique
from tests.local.conftest import local_leftovers


@pytest.fixture(scope="module")
def api_cluster(tmp_path_factory):
    """A 3-node local cluster brought up with Cluster.up (its own CLUSTERTOOL_HOME); down after."""
    tmp = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLUSTERTOOL_HOME", str(tmp / "home"))
        mp.setenv("CLUSTERTOOL_HOSTFILE_DIR", str(tmp / "hf"))
        mp.setenv("CLUSTERTOOL_NO_SSH_INCLUDE", "1")
        said: list[str] = []
        cluster = Cluster.up(provider="local", nodes=3, name=unique("api"), report=said.append)
        try:
            yield cluster, dict(os.environ), said
        finally:
            if state.exists(cluster.name):
                cluster.down()
            assert local_leftovers(cluster.name) == []


def without_durations(data: dict) -> dict:
    return {**data, "results": [{k: v for k, v in r.items() if k != "duration"} for r in data["results"]]}


def test_up_reports_through_the_callback_and_the_api_is_silent_otherwise(api_cluster, capfd):
    cluster, _, said = api_cluster
    assert any("provisioning 3 node(s)" in line for line in said)
    assert [n.name for n in cluster.nodes] == ["node-1", "node-2", "node-3"]
    capfd.readouterr()
    Cluster.load(cluster.name).exec("echo hi; echo there >&2")
    assert capfd.readouterr() == ("", "")


def test_exec_returns_what_exec_json_prints(api_cluster):
    cluster, env, _ = api_cluster
    line = 'hostname; if [ "$(hostname)" = node-2 ]; then echo broken >&2; exit 3; fi'
    result = cluster.exec(line)
    proc = run_cli("exec", "-c", cluster.name, "--json", "--", line, env=env)
    printed = json.loads(proc.stdout)
    assert proc.returncode == result.exit_code == 3
    assert without_durations(printed) == without_durations(result.to_dict())
    assert all(isinstance(r["duration"], float) for r in printed["results"] + result.to_dict()["results"])
    assert result.by_node()["node-2"].reason == "exit 3: broken"
    assert [r.stdout for r in result.results] == ["node-1\n", "node-2\n", "node-3\n"]


def test_exec_check_raises_the_tools_error_naming_the_node(api_cluster):
    cluster, _, _ = api_cluster
    with pytest.raises(ToolError) as info:
        cluster.exec('[ "$(hostname)" != node-3 ] || { echo no disk >&2; exit 2; }', check=True)
    assert info.value.message == "1 node(s) failed: node-3: exit 2: no disk"
    assert info.value.exit_code == 2


def test_status_returns_what_status_json_prints(api_cluster):
    cluster, env, _ = api_cluster
    proc = run_cli("status", "-c", cluster.name, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == cluster.status().to_dict()
    assert [(n.node, n.reachable) for n in cluster.status().nodes] == [
        ("node-1", True), ("node-2", True), ("node-3", True)]


def test_a_job_runs_is_waited_for_and_shows_its_lines(api_cluster):
    cluster, _, _ = api_cluster
    job = cluster.run(["python3", "-c", "import os, socket; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], "
                                        "'on', socket.gethostname())"], name="hello")
    assert job.wait(timeout=120) == 0
    assert job.state == "succeeded"
    ranks = [line for line in job.logs() if line.startswith("[1,")]  # mpirun may add untagged warnings
    assert sorted(ranks) == [f"[1,{r}]<stdout>:rank {r} on node-{r + 1}" for r in range(3)]
    assert [line for line in job.logs(rank=1) if line.startswith("[1,")] == ["[1,1]<stdout>:rank 1 on node-2"]
    failing = cluster.run("sh -c 'exit 3'", nodes="leader")
    assert failing.wait(timeout=120) == 3 and failing.state == "failed"
    assert {j.id for j in cluster.jobs()} >= {job.id, failing.id}
    assert cluster.job("hello").id == job.id


def test_wait_gives_up_with_a_hint_and_kill_stops_the_job_everywhere(api_cluster):
    cluster, _, _ = api_cluster
    job = cluster.run("sleep 300")
    with pytest.raises(ToolError) as info:
        job.wait(timeout=1)
    assert "still running after 1s" in info.value.message and "clustertool kill" in info.value.hint
    result = job.kill(grace=2)
    assert result.clean, result.nodes
    assert job.state == "killed"
    assert job.wait(timeout=30) == job.exit_code and job.state == "killed"  # an ended job: no waiting


def test_errors_are_the_tools_own_with_message_and_hint(api_cluster):
    cluster, _, _ = api_cluster
    with pytest.raises(StateError) as info:
        Cluster.load("nosuch-cluster")
    assert info.value.message == "no cluster named 'nosuch-cluster'" and cluster.name in info.value.hint
    with pytest.raises(UsageError, match="--np 99 is more than the 3 slot"):
        cluster.run("hostname", np=99)
    with pytest.raises(UsageError, match="node-9"):
        cluster.exec("true", nodes="node-9")
    with pytest.raises(UsageError, match="already exists"):
        Cluster.up(provider="local", nodes=1, name=cluster.name)


def test_fabric_runs_a_command_on_every_node(api_cluster):
    cluster, _, _ = api_cluster
    with cluster.fabric() as group:
        results = group.run("hostname", hide=True, in_stream=False)
    assert sorted(r.stdout.strip() for r in results.values()) == ["node-1", "node-2", "node-3"]
    with cluster.fabric(nodes="members") as group:
        assert len(group) == 2


def test_fabric_refuses_a_changed_or_an_unknown_host_key(api_cluster):
    from fabric.exceptions import GroupException
    from paramiko import BadHostKeyException, SSHException

    cluster, _, _ = api_cluster
    known_hosts = state.ClusterPaths(cluster.name).known_hosts
    original = known_hosts.read_text()
    lines = original.splitlines()
    node3_key = next(ln for ln in lines if ln.startswith(f"{cluster.name}-node-3 ")).split(" ", 1)[1]
    node2 = cluster.record.node("node-2").address
    try:
        known_hosts.write_text("".join((f"{cluster.name}-node-2 {node3_key}" if ln.startswith(
            f"{cluster.name}-node-2 ") else ln) + "\n" for ln in lines))
        with pytest.raises(GroupException) as info:
            cluster.fabric().run("true", hide=True, in_stream=False)
        failed = {c.host: exc for c, exc in info.value.result.failed.items()}
        assert list(failed) == [node2] and isinstance(failed[node2], BadHostKeyException)
        assert len(info.value.result.succeeded) == 2

        known_hosts.write_text("".join(ln + "\n" for ln in lines if not ln.startswith(f"{cluster.name}-node-2 ")))
        with pytest.raises(GroupException) as info:
            cluster.fabric().run("true", hide=True, in_stream=False)
        failed = {c.host: exc for c, exc in info.value.result.failed.items()}
        assert list(failed) == [node2] and isinstance(failed[node2], SSHException)
        assert "not found in known_hosts" in str(failed[node2])
    finally:
        known_hosts.write_text(original)
    assert len(cluster.fabric().run("true", hide=True, in_stream=False).succeeded) == 3


def test_replace_with_copy_puts_the_path_back_on_the_new_node(api_cluster):
    """Cluster.replace(copy=...), as `replace --copy`: a new machine, then the path from the leader's disk."""
    cluster, _, said = api_cluster
    cluster.exec("mkdir -p dataset/sub && printf abc > dataset/sub/part.bin && touch /scratch/old-disk",
                 nodes="leader,node-3", check=True)
    with pytest.raises(UsageError, match="--copy: the leader node-1 is being replaced"):
        cluster.replace("node-1", copy=["dataset"])
    result = cluster.replace("node-3", copy=["dataset"])
    assert [r.node for r in result.replaced] == ["node-3"] and [c.exit_code for c in result.copied] == [0]
    assert result.to_dict()["copied"][0]["exit_code"] == 0 and result.to_dict()["replaced"][0]["node"] == "node-3"
    assert any("copying dataset from node-1 to node-3" in line for line in said)
    new = cluster.exec("cat dataset/sub/part.bin; test -e /scratch/old-disk || echo ' gone'", nodes="node-3",
                       check=True).results[0].stdout
    assert new == "abc gone\n"  # the copy is back, what else was on the old disk is gone


def test_follow_with_recover_replaces_a_lost_node_and_the_job_goes_on(api_cluster):
    """Job.follow(recover=True), as `run --follow --replace-failed`: the recovery loop runs beside the stream."""
    from clustertool.providers.local import net, sysops

    cluster, _, said = api_cluster
    line = ('[ "$CLUSTERTOOL_RESTART_COUNT" = 0 ] && exec sleep 300; '
            'echo "attempt $CLUSTERTOOL_RESTART_COUNT rank $OMPI_COMM_WORLD_RANK on $(hostname)"')
    job = cluster.run(["sh", "-c", line], restarts=1, replace_failed=True, tag_output=False)
    deadline = time.monotonic() + 60
    ranks = f'test -n "$(ls "$HOME/{JOBS_DIR}/{job.id}/ranks" 2>/dev/null)"'
    while not cluster.exec(ranks, nodes="node-2").ok:  # its rank started there
        assert time.monotonic() < deadline, "the job's rank did not start on node-2"
        time.sleep(0.2)
    ns = net.netns_name(cluster.name, 2)
    sysops.kill_all(sysops.pids_in_netns([ns])[ns])  # node-2 dies, sshd and rank with it
    lines: list[str] = []
    assert job.follow(lines.append, recover=True) == 0
    assert sorted(ln for ln in lines if ln.startswith("attempt")) == [
        f"attempt 1 rank {r} on node-{r + 1}" for r in range(3)]
    assert job.state == "succeeded" and [a["cause"] for a in job.attempts] == ["node-2 lost", None]
    assert any("replacing node-2" in ln for ln in said) and any("node-2 replaced" in ln for ln in said)


def test_the_scaling_loop_example_brings_up_runs_compares_and_tears_down(ct_env):
    """examples/scaling_loop.py as a user runs it: up, exec, a job per size (run, wait, logs), down."""
    name = unique("ex")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "scaling_loop.py"), "--name", name],
                          env=ct_env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == f"cluster {name} is up: node-1, node-2, node-3, node-4"
    assert out[1].split() == ["nodes", "samples/sec", "speedup", "efficiency"]
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["1", "2", "4"] and rows[0][2:] == ["1.00", "100%"]
    assert all(float(r[1]) > 0 for r in rows)
    assert "preflight on node-[1-4]" in proc.stderr  # progress went through the reporter, to stderr
    assert name not in state.list_clusters() and local_leftovers(name) == []
