"""`clustertool top` on a real 4-node local cluster: every node, a slowed rank, a slowed link, a clean exit.

GPU columns come from a stand-in nvidia-smi (tests/fakes/smi_loop.py) on node-2 only; the other nodes
have none and say so.  Links: the cluster's --link-rate for every node, then node-3's shaped to a quarter
of it (tc, as the local provider shapes links); traffic is iperf3 from each node to a server of this
test on the cluster's bridge.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import CLI, run_cli
from tests.fakes import smi_loop
from tests.local.conftest import module_cluster, provider_state

pytestmark = pytest.mark.local

RATE_MBIT = 80
SLOW_SCRIPT = r"""
import os, socket, sys, time
slow = socket.gethostname() == os.environ.get("SLOW_NODE", "node-3")
print("ready", flush=True)
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    time.sleep(0.2 + (0.3 if slow else 0.0))   # the slowed rank: a sleep in its step
    print(f"step {step} loss {1.0 / (step + 1):.4f} time {1000 * (time.perf_counter() - t0):.1f}ms", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "tw", "--link-rate", f"{RATE_MBIT}mbit")


@pytest.fixture(scope="module")
def folder():
    """Scripts every node sees (nodes share the host's /var/tmp)."""
    path = Path("/var/tmp") / f"ct-test-watch-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "steps.py").write_text(SLOW_SCRIPT)
    yield path
    shutil.rmtree(path)


def home(cluster, node: str) -> Path:
    name, env = cluster
    return Path(provider_state(env, name)["nodes_dir"]) / node / "home"


def top_once(cluster, *flags: str) -> dict:
    name, env = cluster
    proc = run_cli("top", "-c", name, "--once", "--json", *flags, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def watch_processes(name: str) -> list[str]:
    """The watch's processes (hub, samplers, the stand-in) in any of the cluster's namespaces."""
    found = []
    for ns, pids in sysops.pids_in_netns([net.netns_name(name, i) for i in range(1, 5)]).items():
        for pid in pids:
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm in ("ct-watch", "nvidia-smi") or "clustertool>" in args or "smi-loop" in args:
                found.append(f"{ns} {pid} {comm} {args[:80]}")
    return found


def test_top_once_json_reports_every_node_with_gpu_columns_from_a_stand_in(cluster):
    smi_loop.write(home(cluster, "node-2") / ".local" / "bin", seen_as="/root/.local/bin")
    try:
        view = top_once(cluster)
    finally:
        shutil.rmtree(home(cluster, "node-2") / ".local")
    nodes = {row["name"]: row for row in view["nodes"]}
    assert sorted(nodes) == ["node-1", "node-2", "node-3", "node-4"]
    assert all(row["state"] == "ok" and row["cpu"] is not None and row["tx"] is not None for row in nodes.values())
    assert all(row["link_bps"] == RATE_MBIT * 10**6 and row["link_source"] == "recorded" for row in nodes.values())
    gpus = nodes["node-2"]["gpus"]
    assert [g["util"] for g in gpus] in ([97, 95], [98, 96]) and gpus[1]["reasons"] == ["sw_power_cap"]
    assert nodes["node-2"]["gpu_util"] in (96.0, 97.0)
    assert [nodes[n]["gpus"] for n in ("node-1", "node-3", "node-4")] == [None, None, None]   # "no GPU"
    assert nodes["node-1"]["disk"]["free"] > 0
    assert watch_processes(cluster[0]) == []


def test_a_rank_slowed_on_purpose_is_named_by_top(cluster, folder):
    name, env = cluster
    started = run_cli("run", "-c", name, "--launcher", "process", "--", "python3", str(folder / "steps.py"), "600",
                      env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    try:
        deadline = time.monotonic() + 90
        while True:   # every rank has printed a few steps
            view = top_once(cluster, "--job", job_id)
            ranks = view["jobs"][0]["ranks"] if view["jobs"] else []
            if len(ranks) == 4 and all((r.get("step") or 0) >= 3 for r in ranks):
                break
            assert time.monotonic() < deadline, view["jobs"]
        job = top_once(cluster, "--job", job_id)["jobs"][0]
        by_rank = {r["rank"]: r for r in job["ranks"]}
        slow = [r for r in job["ranks"] if r["node"] == "node-3"]
        assert len(slow) == 1 and job["outliers"] == [slow[0]["rank"]], job
        assert job["slowest"][0] == slow[0]["rank"] and slow[0]["ratio"] > 2.0
        assert all(not r["outlier"] for k, r in by_rank.items() if k != slow[0]["rank"])
        table = run_cli("top", "-c", name, "--once", env=env, timeout=120).stdout
        assert f"rank {slow[0]['rank']} on node-3 step time x" in table
    finally:
        assert run_cli("kill", "-c", name, job_id, env=env, timeout=120).returncode == 0


def _shape(name: str, env: dict, index: int, rate: str) -> None:
    slot = int(provider_state(env, name)["slot"])
    lines = net.shaping_lines(net.NODE_IFACE, rate, None)
    subprocess.run(net.tc_batch_argv(net.netns_name(name, index)), input="\n".join(lines) + "\n", text=True,
                   check=True)
    host = net.shaping_lines(net.veth_name(slot, index), rate, None)
    subprocess.run(net.tc_batch_argv(), input="\n".join(host) + "\n", text=True, check=True)


def test_a_link_shaped_to_a_quarter_shows_in_the_network_column(cluster):
    name, env = cluster
    if not shutil.which("iperf3"):
        pytest.skip("needs iperf3 (the Makefile's apt packages)")
    bridge = provider_state(env, name)["bridge"]
    addr = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True,
                          text=True).stdout.split()[3].split("/")[0]
    _shape(name, env, 3, f"{RATE_MBIT // 4}mbit")
    servers, clients = [], []
    try:
        for i in range(1, 5):
            servers.append(subprocess.Popen(["iperf3", "-s", "-1", "-B", addr, "-p", str(5300 + i)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for i in range(1, 5):
            clients.append(subprocess.Popen(
                CLI + ["exec", "-c", name, "-n", f"node-{i}", "--", f"iperf3 -c {addr} -p {5300 + i} -t 25"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4)
        view = top_once(cluster)
        table = run_cli("top", "-c", name, "--once", env=env, timeout=120).stdout
    finally:
        for p in servers:
            p.terminate()
        for p in clients + servers:
            p.wait(timeout=60)
        _shape(name, env, 3, f"{RATE_MBIT}mbit")
    nodes = {row["name"]: row for row in view["nodes"]}
    assert "tx" in nodes["node-3"]["net_outlier"], nodes["node-3"]
    assert 0.15 < nodes["node-3"]["net_ratio"]["tx"] < 0.4
    assert all("tx" not in nodes[n]["net_outlier"] for n in ("node-1", "node-2", "node-4"))
    assert "node-3: network tx at x0." in table, table


def test_top_live_redraws_and_leaves_nothing_on_the_nodes(cluster):
    name, env = cluster
    proc = subprocess.Popen(CLI + ["top", "-c", name, "--interval", "0.5"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(8)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert out.count("node-4") >= 3, out + err   # redrawn, reading after reading
    deadline = time.monotonic() + 20
    while watch_processes(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert watch_processes(name) == []
