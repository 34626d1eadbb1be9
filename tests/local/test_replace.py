"""`replace` on real local nodes: a node whose whole namespace was killed (sshd included) gets a new
namespace, sshd and disk under its name and address; its new host key is pinned here and on every node
(strict host key checking is on everywhere, so `exec` and mpirun reaching it prove the pins), the
hostfiles hold it again (its cordon lifted), and nothing of the old node is left.  The leader is
replaced too, while it runs: its old processes are gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import run_cli
from tests.local.conftest import local_leftovers, provider_state


def _status(name: str, env: dict) -> dict:
    proc = run_cli("status", "-c", name, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}


def _kill_namespace(name: str, index: int) -> list[int]:
    ns = net.netns_name(name, index)
    pids = sysops.pids_in_netns([ns])[ns]
    assert pids, f"{ns} has processes"
    sysops.kill_all(pids)  # SIGKILL each (sshd and ct-init included), until all are gone
    return pids


def _replace(name: str, env: dict, node: str) -> dict:
    proc = run_cli("replace", node, "--yes", "-c", name, "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_dead_node_and_the_leader_are_replaced_with_new_pinned_keys_and_nothing_old_is_left(local_cluster, ct_env):
    name = local_cluster(3)
    env = ct_env
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    marked = run_cli("exec", "-c", name, "-n", "node-3", "--", "touch", "/scratch/on-the-old-disk", env=env)
    assert marked.returncode == 0, marked.stderr
    assert run_cli("cordon", "node-3", "-c", name, env=env).returncode == 0
    unknown = run_cli("replace", "node-7", "--yes", "-c", name, env=env)
    assert unknown.returncode != 0 and unknown.stderr.splitlines()[0] == (
        f"error: cluster {name!r} has no node node-7 (its nodes: node-[1-3]; also all, leader, members, workers, "
        "servers)")
    before = _status(name, env)
    old_keys = {n: (nodes_dir / n / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()[1] for n in before}

    killed = _kill_namespace(name, 3)
    assert _status(name, env)["node-3"]["reachable"] is False
    done = _replace(name, env, "node-3")
    (r,) = done["replaced"]
    assert r["node"] == "node-3" and r["address"] == before["node-3"]["address"] and r["cordon_lifted"]
    assert r["old_host_key"] == before["node-3"]["host_key"] and r["new_host_key"] not in (None, r["old_host_key"])
    assert "is gone" in done["disk"]
    now = _status(name, env)
    assert now["node-3"]["host_key"] == r["new_host_key"] and now["node-3"]["reachable"] is True
    assert now["node-3"]["cordon"] is None and now["node-3"]["state"] == "running"
    assert before["node-3"]["address"] in Path(done["hostfile"]).read_text()
    assert not any(sysops.alive(p) for p in killed)

    leader_pids = sysops.pids_in_netns([net.netns_name(name, 1)])[net.netns_name(name, 1)]
    lead = _replace(name, env, "node-1")["replaced"][0]
    assert lead["role"] == "leader" and lead["new_host_key"] != before["node-1"]["host_key"]
    assert not any(sysops.alive(p) for p in leader_pids), "the old leader's processes are gone"

    text = run_cli("status", "-c", name, env=env).stdout
    assert "node-3 replaced:" in text and r["new_host_key"] in text
    # every node's known_hosts (and this machine's) holds the new keys and none of the old
    for node in ("node-1", "node-2", "node-3"):
        known = (nodes_dir / node / "home" / ".ssh" / f"clustertool-{name}.known_hosts").read_text()
        for old in ("node-1", "node-3"):
            assert old_keys[old] not in known, f"{node} still trusts the old {old}"
        assert (nodes_dir / "node-3" / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()[1] in known
    assert (nodes_dir / "node-1" / "home" / "hostfile").read_text().count("slots=") == 3

    reached = run_cli("exec", "-c", name, "--json", "--", "hostname", env=env)
    assert reached.returncode == 0, reached.stderr
    assert sorted(x["stdout"].strip() for x in json.loads(reached.stdout)["results"]) == ["node-1", "node-2", "node-3"]
    assert run_cli("exec", "-c", name, "-n", "node-3", "--", "test", "!", "-e", "/scratch/on-the-old-disk",
                   env=env).returncode == 0, "the old disk is gone"
    ran = run_cli("run", "-c", name, "--follow", "--", "hostname", env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    hosts = {line.rsplit(":", 1)[1] for line in ran.stdout.splitlines() if "<stdout>:" in line}
    assert hosts == {"node-1", "node-2", "node-3"}, ran.stdout  # one rank per node, mpirun over all three

    assert sorted(p.name for p in nodes_dir.iterdir() if p.name.startswith(".")) == []
    assert run_cli("down", "-c", name, "--yes", env=env).returncode == 0
    assert local_leftovers(name) == []


def test_a_replacement_that_fails_halfway_leaves_no_half_made_node_and_a_second_try_works(
        local_cluster, ct_env, monkeypatch):
    """Through the Python API (in this process, so the start of the new node can be made to fail after
    its namespace and veth exist): everything of the new node goes, the old disk comes back, status
    marks the node; `cluster.replace` again makes it."""
    from clustertool.api import Cluster
    from clustertool.providers.local import nodes

    name = local_cluster(2)
    nodes_dir = Path(provider_state(ct_env, name)["nodes_dir"])
    (nodes_dir / "node-2" / "scratch" / "kept").write_text("old disk")
    real_start = nodes.start_node

    def broken(cluster, index):
        assert sysops.netns_exists(net.netns_name(name, index))  # the new namespace is made by now
        raise RuntimeError("injected: the new node's PID 1 would not start")

    monkeypatch.setattr(nodes, "start_node", broken)
    cluster = Cluster.load(name)
    with pytest.raises(RuntimeError):
        cluster.replace("node-2")
    assert not sysops.netns_exists(net.netns_name(name, 2))
    assert sorted(p.name for p in nodes_dir.iterdir() if p.name.startswith(".")) == []
    assert (nodes_dir / "node-2" / "scratch" / "kept").read_text() == "old disk"
    shown = run_cli("status", "-c", name, "--no-check", env=ct_env).stdout  # node-2's address answers nothing now
    assert "node-2 replace: FAILED" in shown and "`clustertool replace node-2` again" in shown, shown

    monkeypatch.setattr(nodes, "start_node", real_start)
    done = Cluster.load(name).replace(["node-2"])
    assert [r.node for r in done.replaced] == ["node-2"]
    now = _status(name, ct_env)
    assert now["node-2"]["reachable"] is True and now["node-2"]["host_key"] == done.replaced[0].new_host_key
    assert "FAILED" not in run_cli("status", "-c", name, env=ct_env).stdout
