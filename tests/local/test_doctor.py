"""doctor on a real 4-node local cluster: clean when clean, and each planted fault found."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import run_cli
from tests.local.conftest import module_cluster, stop_node_sshd

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 4-node cluster for the module (bringing one up per test would be slow).  Its links are shaped to 500
    Mbit/s, as a real cluster's network sets its rate: unshaped veths run as fast as the CPU lets iperf3, and on a
    loaded 2-core box one of two pairs measured at once got half the other's CPU twice, a "slow link"."""
    yield from module_cluster(tmp_path_factory, 4, "dr", "--link-rate", "500mbit")


def doctor(cluster, *args):
    name, env = cluster
    proc = run_cli("doctor", "-c", name, "--json", *args, env=env, timeout=180)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def on(cluster, node, line):
    name, env = cluster
    proc = run_cli("exec", "-c", name, "-n", node, "--no-live", "--", line, env=env)
    return proc


def problems(report, check=None):
    return [f for c in report["checks"] for f in c["findings"]
            if f["severity"] in ("warning", "error") and (check is None or f["check"] == check)]


def test_clean_cluster_is_reported_clean_by_every_check(cluster):
    code, report = doctor(cluster)
    assert code == 0 and report["clean"], problems(report)
    assert [c["name"] for c in report["checks"]] == [
        "reach", "ssh-mesh", "disk", "sameness", "strays", "clock", "mpi-smoke", "network", "plugin-nccl",
        "gpu", "efa", "shared-fs", "slurm"]
    assert all(c["skipped"] is None and c["status"] == "ok" for c in report["checks"][:-5])
    assert [(c["status"], c["skipped"]) for c in report["checks"][-5:]] == [
        ("skipped", "no GPU"), ("skipped", "no GPU"), ("skipped", "no EFA interfaces"),
        ("skipped", "no shared filesystem"), ("skipped", "no Slurm")]
    network = next(c for c in report["checks"] if c["name"] == "network")["data"]
    # a clean cluster gets the whole budget of rounds, ceil(log2(4)) + 1; a pair that measured slow once
    # is measured again instead of a new one, so 4 to 6 of the 6 pairs
    assert network["rounds"] == 3 and len(network["pairs_bits_per_s"]) >= 4


def test_stray_python_is_found_and_fix_kills_only_it(cluster):
    assert on(cluster, "node-2", "setsid python3 -c 'import time; time.sleep(600)' "
                                 ">/dev/null 2>&1 < /dev/null &").returncode == 0
    code, report = doctor(cluster, "--check", "strays")
    found = problems(report, "strays")
    assert code == 0 and [f["node"] for f in found] == ["node-2"], found
    assert "python3" in found[0]["message"]
    code, report = doctor(cluster, "--check", "strays", "--fix")
    assert report["clean"] and report["fixed"] == ["node-2: killed 1 stray process(es)"]
    ns = net.netns_name(cluster[0], 2)
    comms = [sysops.comm(p) for p in sysops.pids_in_netns([ns]).get(ns, [])]
    assert "python3" not in comms and "sshd" in comms


def test_a_process_left_by_an_ended_job_is_a_stray_whatever_its_name(cluster):
    """A torchrun agent stuck in its exit barrier is named ``torchrun``, no python by name: its job's mark
    (CLUSTERTOOL_JOB of a job that is not running) makes it a stray, as `run`'s preflight already sees it."""
    assert on(cluster, "node-3", "CLUSTERTOOL_JOB=j0101-0ded00 setsid sleep 600 "
                                 ">/dev/null 2>&1 < /dev/null &").returncode == 0
    code, report = doctor(cluster, "--check", "strays")
    found = problems(report, "strays")
    assert [f["node"] for f in found] == ["node-3"], found
    assert "sleep (job j0101-0ded00, ended)" in found[0]["message"]
    code, report = doctor(cluster, "--check", "strays", "--fix")
    assert report["clean"] and report["fixed"] == ["node-3: killed 1 stray process(es)"]
    ns = net.netns_name(cluster[0], 3)
    assert "sleep" not in [sysops.comm(p) for p in sysops.pids_in_netns([ns]).get(ns, [])]


def test_full_disk_on_one_node_is_an_error(cluster):
    fill = ("mount -t tmpfs -o size=1m tmpfs /scratch && "
            "dd if=/dev/zero of=/scratch/fill bs=64k count=64 2>/dev/null; df -k /scratch")
    assert on(cluster, "node-3", fill).returncode == 0
    try:
        code, report = doctor(cluster, "--check", "disk")
        found = problems(report, "disk")
        assert code == 1 and [(f["node"], f["severity"]) for f in found] == [("node-3", "error")], found
        assert "/scratch" in found[0]["message"] and "0 MiB free" in found[0]["message"]
    finally:
        on(cluster, "node-3", "umount /scratch")
    assert doctor(cluster, "--check", "disk")[1]["clean"]


@pytest.mark.parametrize("where", ["deployed", "--plugin-path"])
def test_different_plugin_checksum_on_one_node_is_an_error(cluster, where):
    """At the path `plugin deploy` uses on local nodes (each node's private home),
    or at a path given with --plugin-path."""
    from clustertool.core.model import ClusterRecord
    from clustertool.plugin.build import NET_LIB
    from clustertool.plugin.deploy import default_dest

    folder = (default_dest(ClusterRecord(cluster[0], "local")) if where == "deployed" else "/root/ct-plugin")
    path = f"{folder}/{NET_LIB}"
    for node in ("node-1", "node-2", "node-3"):
        on(cluster, node, f"mkdir -p {folder} && printf 'plugin v1' > {path}")
    on(cluster, "node-4", f"mkdir -p {folder} && printf 'plugin v2' > {path}")
    try:
        extra = ("--plugin-path", path) if where == "--plugin-path" else ()
        code, report = doctor(cluster, "--check", "sameness", *extra)
        found = problems(report, "sameness")
        assert code == 1 and [f["node"] for f in found] == ["node-4"], found
        assert "plugin checksum" in found[0]["message"]
    finally:
        on(cluster, "node-1,node-2,node-3,node-4", f"rm -f {path}")


def test_lost_known_hosts_on_one_node_is_found_and_fix_pushes_them_again(cluster):
    name, _ = cluster
    assert on(cluster, "node-2", f"rm ~/.ssh/clustertool-{name}.known_hosts").returncode == 0
    code, report = doctor(cluster, "--check", "ssh-mesh")
    found = problems(report, "ssh-mesh")
    assert code == 1 and found and all(f["fixable"] for f in found), found
    assert all(f["data"]["from"] == ["node-2"] for f in found)
    code, report = doctor(cluster, "--check", "ssh-mesh", "--fix")
    assert code == 0 and report["clean"], problems(report)
    assert report["fixed"] == ["pushed the cluster key, pinned known_hosts and ssh config to every node"]


def _shape(cluster, node_index, rate):
    name, env = cluster
    state = json.loads(open(os.path.join(env["CLUSTERTOOL_HOME"], "clusters", f"{name}.json")).read())
    veth = net.veth_name(state["provider_state"]["slot"], node_index)
    ns = net.netns_name(name, node_index)
    for argv, dev in ((net.tc_batch_argv(), veth), (net.tc_batch_argv(ns), net.NODE_IFACE)):
        lines = (net.shaping_lines(dev, rate, None) if rate
                 else [f"qdisc del dev {dev} root"])
        subprocess.run(argv, input="\n".join(lines) + "\n", text=True, check=True)


def test_one_link_shaped_ten_times_slower_stands_out(cluster):
    code, report = doctor(cluster, "--check", "links")
    fast = min(next(c for c in report["checks"] if c["name"] == "network")["data"]["node_median_bits_per_s"].values())
    rate = f"{max(1, int(fast / 10 / 1e6))}mbit"  # a tenth of the slowest node's measured speed
    _shape(cluster, 3, rate)
    try:
        code, report = doctor(cluster, "--check", "links")
        found = problems(report, "network")
        assert code == 1 and [f["node"] for f in found] == ["node-3"], (rate, found)
        assert "slow link" in found[0]["message"]
    finally:
        _shape(cluster, 3, None)


def test_node_with_sshd_stopped_is_found_then_reboot_brings_it_back(cluster):
    name, env = cluster
    stop_node_sshd(name, 4)
    code, report = doctor(cluster, "--skip", "links")
    assert code == 1
    assert [f["node"] for f in problems(report, "reach")] == ["node-4"]
    mesh = problems(report, "ssh-mesh")
    assert [f["node"] for f in mesh] == ["node-4"] and "no node can ssh to node-4" in mesh[0]["message"]
    assert next(c for c in report["checks"] if c["name"] == "mpi-smoke")["skipped"]
    proc = run_cli("reboot", "-c", name, "--nodes", "node-4", "--yes", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, report = doctor(cluster, "--skip", "links")
    assert code == 0 and report["clean"], problems(report)
