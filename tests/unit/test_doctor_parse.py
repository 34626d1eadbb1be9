"""doctor's node programs and parsers: facts, iperf3 JSON, mesh output, pair rounds, fix lines."""

from __future__ import annotations

import json
import subprocess

import pytest

from clustertool.cluster.facts import facts_script, parse_facts
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.doctor import fixes, netchecks
from clustertool.doctor.doctorrequests import choose_checks
from clustertool.remote.mesh import mesh_peers, mesh_script

pytestmark = pytest.mark.unit


def nodes(n):
    return [Node(f"node-{i}", i, f"10.0.0.{i}") for i in range(1, n + 1)]


def test_facts_script_runs_here_and_parses(tmp_path):
    plugin = tmp_path / "lib.so"
    plugin.write_bytes(b"x")
    out = subprocess.run(["sh", "-s"], input=facts_script(str(plugin), [str(tmp_path)]), text=True,
                         capture_output=True, check=True).stdout
    f = parse_facts("node-1", out)
    assert f.values["nproc"].isdigit()
    assert f.values["plugin"] == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    assert str(tmp_path) in [d.path for d in f.disks]
    assert all(d.total_kb > 0 for d in f.disks)
    missing = subprocess.run(["sh", "-s"], input=facts_script(str(tmp_path / "nope.so"), []), text=True,
                             capture_output=True, check=True).stdout
    assert parse_facts("n", missing).values["plugin"] == "absent"


def test_parse_facts_lines():
    text = ("nproc=8\ngpus=none\ndf /scratch 1024 0 /scratch\n"
            "proc 42 python3 - python3 -c import time\nproc 43 orted j1-abc orted -mca x\n")
    f = parse_facts("node-2", text)
    assert f.values == {"nproc": "8", "gpus": "none"}
    assert f.disks[0].free_pct == 0.0 and f.disks[0].mount == "/scratch"
    assert [(p.pid, p.comm, p.job, p.args) for p in f.procs] == [
        (42, "python3", None, "python3 -c import time"), (43, "orted", "j1-abc", "orted -mca x")]


def test_parse_iperf_takes_the_slower_direction():
    text = json.dumps({"end": {"sum_received": {"bits_per_second": 9e9},
                               "sum_received_bidir_reverse": {"bits_per_second": 1e9}}})
    assert netchecks.parse_iperf(text) == 1e9
    with pytest.raises(ValueError, match="unable to connect"):
        netchecks.parse_iperf(json.dumps({"error": "unable to connect to server", "end": {}}))
    with pytest.raises(ValueError):
        netchecks.parse_iperf("not json")


def test_iperf_client_binds_to_the_source_and_targets_only_the_peer_address():
    a, b = nodes(2)
    assert netchecks.iperf_client_line(a, b, 41234) == (
        "iperf3 -c 10.0.0.2 -B 10.0.0.1 -p 41234 -t 1 --bidir -J --connect-timeout 3000")


def test_mesh_findings_collapse_a_dead_target():
    cluster = ClusterRecord("c", "local", nodes=nodes(3))
    outputs = {"node-1": "fail 10.0.0.3 ssh: connect to host 10.0.0.3 port 22: Connection refused\n",
               "node-2": "fail 10.0.0.3 ssh: connect to host 10.0.0.3 port 22: Connection refused\n"}
    found = netchecks.mesh_findings(cluster, cluster.nodes[:2], outputs, {"node-3"})
    assert [(f.node, f.fixable) for f in found] == [("node-3", False)]
    assert found[0].message.startswith("no node can ssh to node-3")


def test_mesh_host_key_failures_are_fixable():
    cluster = ClusterRecord("c", "local", nodes=nodes(3))
    outputs = {"node-1": "fail 10.0.0.2 Host key verification failed.\n"}
    found = netchecks.mesh_findings(cluster, cluster.nodes, outputs, set())
    assert [(f.node, f.fixable) for f in found] == [("node-2", True)]
    assert found[0].message.startswith("node-1 cannot ssh to node-2")


def test_mesh_script_reaches_every_target_by_address():
    script = mesh_script(nodes(3)[1:])
    assert "ssh -o ConnectTimeout=10 -o BatchMode=yes 10.0.0.2 true" in script
    assert "10.0.0.3" in script and "10.0.0.1" not in script


def test_fix_kills_only_pids_whose_command_is_unchanged():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        line = fixes.kill_pids_line({str(sleeper.pid): "not-sleep"})
        subprocess.run(["sh", "-c", line], check=True)
        assert sleeper.poll() is None
        subprocess.run(["sh", "-c", fixes.kill_pids_line({str(sleeper.pid): "sleep"})], check=True)
        assert sleeper.wait(timeout=5) == -9
    finally:
        sleeper.kill()


def test_the_mesh_is_every_pair_on_small_clusters_and_a_ring_sample_on_large_ones():
    small = mesh_peers(nodes(16))
    assert all(len(peers) == 15 for peers in small.values())
    big = nodes(254)
    peers = mesh_peers(big)
    assert all(len(p) == 4 and name not in {q.name for q in p} for name, p in peers.items())
    tried_by = {n.name: 0 for n in big}
    for p in peers.values():
        for q in p:
            tried_by[q.name] += 1
    assert set(tried_by.values()) == {4}  # every node is tried by four others: a bad one shows from four sides
    assert sum(map(len, peers.values())) == 254 * 4  # O(n) handshakes, not 254 * 253
    reached, todo = {"node-1"}, ["node-1"]  # the tried pairs connect everything: any split is crossed
    while todo:
        for q in peers[todo.pop()]:
            if q.name not in reached:
                reached.add(q.name)
                todo.append(q.name)
    assert len(reached) == 254


def test_a_sampled_mesh_says_no_node_can_reach_a_target_when_all_that_tried_it_failed():
    cluster = ClusterRecord("c", "local", nodes=nodes(40))
    assert mesh_script(nodes(3), parallel=False).count(" &") == 0
    peers = mesh_peers(cluster.nodes)
    target = cluster.nodes[20]
    sources = [n for n in cluster.nodes if target in peers[n.name]]
    outputs = {s.name: f"fail {target.address} ssh: connect to host port 22: Connection refused\n" for s in sources}
    others = [n for n in cluster.nodes if n is not target]
    found = netchecks.mesh_findings(cluster, others, outputs, {target.name}, peers)
    assert [f.node for f in found] == [target.name] and found[0].message.startswith(f"no node can ssh to {target.name}")


@pytest.mark.parametrize("check,skip,want", [
    (["reach,mesh"], [], ("reach", "ssh-mesh")),
    (["reach", "ssh-mesh"], [], ("reach", "ssh-mesh")),
    ([], ["links,mpi-smoke"], ("reach", "ssh-mesh", "disk", "sameness", "strays", "clock", "plugin-nccl", "gpu",
                               "efa", "shared-fs", "slurm")),
    (["shared"], [], ("shared-fs",)),
])
def test_checks_come_repeated_or_comma_separated_with_short_names(check, skip, want):
    assert choose_checks(check, skip) == want


def test_an_unknown_check_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown check 'meshh'"):
        choose_checks(["reach,meshh"], [])
