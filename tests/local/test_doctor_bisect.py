"""`doctor --bisect` on real local clusters with 200 Mbit/s links (tc tbf at both ends of every node's
veth): one node's link shaped to 50 Mbit/s is named, and only it, within ceil(log2(n)) + 1 rounds;
a clean cluster is named nothing, run after run; a node with 20 ms more delay (netem, where the
kernel has it) is named for latency."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local

RATE = "200mbit"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 8, "bi", "--link-rate", RATE)


def bisect(cluster, *args):
    name, env = cluster
    proc = run_cli("doctor", "-c", name, "--bisect", "--json", *args, env=env, timeout=300)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    return proc.returncode, report, next(c for c in report["checks"] if c["name"] == "network")


def problems(report):
    return [f for c in report["checks"] for f in c["findings"] if f["severity"] in ("warning", "error")]


def shape(cluster, index, rate, delay=None):
    """Both ends of node ``index``'s link (the host's veth, the node's eth0): ``rate``, and ``delay``."""
    name, env = cluster
    state = json.loads(open(os.path.join(env["CLUSTERTOOL_HOME"], "clusters", f"{name}.json")).read())
    veth = net.veth_name(state["provider_state"]["slot"], index)
    for argv, dev in ((net.tc_batch_argv(force=True), veth),
                      (net.tc_batch_argv(net.netns_name(name, index), force=True), net.NODE_IFACE)):
        lines = [f"qdisc del dev {dev} root", *net.shaping_lines(dev, rate, delay)]
        subprocess.run(argv, input="\n".join(lines) + "\n", text=True, check=True)


def bisect_shaped(cluster, index, rate, delay=None):
    """`doctor --bisect` while node ``index``'s link is shaped; the link is back to RATE afterwards."""
    shape(cluster, index, rate, delay)
    try:
        return bisect(cluster)
    finally:
        shape(cluster, index, RATE)


def test_a_clean_cluster_is_named_nothing_three_runs_in_a_row(cluster):
    for run in range(3):
        code, report, network = bisect(cluster)
        assert code == 0 and report["clean"], (run, problems(report))
        data = network["data"]
        assert data["mode"] == "bisect" and data["rounds"] == data["max_rounds"] == 4  # ceil(log2(8)) + 1
        assert len(data["measurements"]) == 4 * 4 and data["expected_bits_per_s"] == 200e6
        for m in data["measurements"]:
            assert m["bits_per_s"] > 0 and m["rtt_s"] > 0 and not m["error"], m


def test_a_node_shaped_to_a_quarter_of_the_rate_is_named_alone(cluster):
    code, report, network = bisect_shaped(cluster, 5, "50mbit")
    found = problems(report)
    assert code == 1 and [(f["node"], f["severity"]) for f in found] == [("node-5", "error")], found
    assert found[0]["message"].startswith("slow link: ") and "with every partner" in found[0]["message"]
    assert found[0]["fix"].startswith("`clustertool cordon node-5`")
    data = network["data"]
    assert data["rounds"] <= math.ceil(math.log2(8)) + 1
    with_5 = [m for m in data["measurements"] if "node-5" in (m["a"], m["b"])]
    assert len(with_5) >= 2 and all(m["bits_per_s"] < 0.8 * data["median_bits_per_s"] for m in with_5), with_5
    assert data["allreduce_halves"]["skipped"].startswith("collnet_bench is not deployed")


def _netem() -> bool:
    return sysops.run(net.netem_probe_argv(), check=False).returncode == 0


@pytest.mark.skipif(not _netem(), reason="kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM)")
def test_a_node_with_20ms_more_delay_is_named_for_latency(cluster):
    code, report, _ = bisect_shaped(cluster, 3, RATE, "20ms")
    found = problems(report)
    assert code == 1 and [(f["node"], f["data"]["metric"]) for f in found] == [("node-3", "latency")], found
    assert "high latency" in found[0]["message"]


def test_with_the_plugin_deployed_an_allreduce_on_halves_shows_the_slow_half(cluster):
    """Last in the module: the deploy stays.  Open MPI's MPI_Allreduce (collnet_bench -a mpi) on each
    half of the 8 nodes at once, node-5 in one half: that half runs slower."""
    name, env = cluster
    for step in (("plugin", "build", "-c", name), ("plugin", "deploy", "-c", name)):
        proc = run_cli(*step, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    code, report, network = bisect_shaped(cluster, 5, "50mbit")
    found = problems(report)
    assert code == 1 and [f["node"] for f in found] == ["node-5"], found
    halves = network["data"]["allreduce_halves"]
    assert "node-5" in halves["halves"][0]["nodes"] and len(halves["halves"][1]["nodes"]) == 4, halves
    assert halves["confirmed"] and "allreduce on its half of the nodes" in found[0]["message"], halves


def test_sixteen_nodes_one_slow_node_named_alone_within_five_rounds(local_cluster, ct_env):
    """Cheap enough for the default run here (about 8 s with `up` and `down`)."""
    name = local_cluster(16, "--link-rate", RATE)
    shape((name, ct_env), 11, "50mbit")
    proc = run_cli("doctor", "-c", name, "--bisect", "--json", env=ct_env, timeout=300)
    report = json.loads(proc.stdout)
    network = next(c for c in report["checks"] if c["name"] == "network")
    assert proc.returncode == 1 and [(f["node"], f["severity"]) for f in problems(report)] == [("node-11", "error")]
    assert network["data"]["rounds"] <= 5
