"""The local provider against the real system: namespaces, veths, tc, sshd (root only).

These call the provider directly (no CLI): a Cluster, a ProvisionRequest with a key made
by ssh-keygen, then run/wait/query/stop/start/terminate.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertool.core.errors import MissingPrerequisite, ProviderError
from clustertool.core.model import ClusterRecord
from clustertool.providers import local
from clustertool.providers.base import ProvisionRequest
from clustertool.providers.local import net, nodes, sysops
from clustertool.providers.local.local_provider import LocalProvider
from tests.conftest import unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local


class Made:
    """A cluster made by the provider in a test, with what a client needs to reach it."""

    def __init__(self, tmp_path: Path, count: int, options: dict):
        self.provider = LocalProvider()
        self.cluster = ClusterRecord(name=unique("lp"), provider="local", options=options)
        self.key = tmp_path / "id_ed25519"
        if not self.key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.files = tmp_path / "cthome" / "clusters" / self.cluster.name
        self.files.mkdir(parents=True)
        self.saved: list[str] = []  # every state the provider asked to persist, as JSON
        self.request = ProvisionRequest(
            cluster=self.cluster, count=count, slots=None,
            public_key=self.key.with_suffix(".pub").read_text(), key_path=self.key,
            files_dir=self.files, save=lambda: self.saved.append(json.dumps(self.cluster.to_dict())))
        self.known_hosts = tmp_path / f"known_hosts-{self.cluster.name}"

    def up(self) -> "Made":
        self.provider.check(self.request)
        self.provider.run_instances(self.request)
        self.provider.wait_instances(self.cluster, timeout=30)
        self.known_hosts.write_text("".join(
            f"{n.address} {k}\n" for n in self.cluster.nodes for k in n.host_keys))
        return self

    def ssh(self, index: int, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        node = self.cluster.nodes[index - 1]
        argv = ["ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                "-o", "LogLevel=ERROR", f"root@{node.address}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def netns(self, index: int) -> str:
        return net.netns_name(self.cluster.name, index)

    def in_node(self, index: int, *argv: str, **kwargs) -> subprocess.Popen:
        """A process in node ``index``'s network namespace only (for traffic tests)."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns(index), *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture
def make(tmp_path):
    made: list[Made] = []

    def factory(count: int = 3, up: bool = True, **options) -> Made:
        m = Made(tmp_path, count, options)
        made.append(m)
        return m.up() if up else m

    yield factory
    for m in made:
        m.provider.terminate_instances(m.cluster)
        assert local_leftovers(m.cluster.name) == []


def snapshot(m: Made) -> dict[str, list[str]]:
    """Everything of this cluster on the machine: namespaces, links, processes, node dirs."""
    tag = net.link_tag(m.cluster.name, m.cluster.provider_state.get("token", "-"))
    ours = net.netns_pattern(m.cluster.name)
    namespaces = [ns for ns in sysops.netns_list() if ours.match(ns)]
    links = [n for n in os.listdir("/sys/class/net")
             if Path("/sys/class/net", n, "ifalias").exists()
             and net.carries(Path("/sys/class/net", n, "ifalias").read_text().strip(), tag)]
    pids = sysops.pids_in_netns(namespaces)
    procs = sorted(f"{sysops.comm(p)}" for group in pids.values() for p in group)
    return {"netns": sorted(namespaces), "links": sorted(links), "processes": procs,
            "node_dirs": sorted(str(p) for p in m.files.glob("local/node-*"))}


def assert_route_matches_bridges():
    """The guard route exists exactly while some local cluster's bridge does (checked under the lock)."""
    with sysops.global_lock():
        assert sysops.route_present() == bool(net.slots_in_use(sysops.bridge_names()))


def test_three_nodes_answer_ssh_with_pinned_host_keys_and_their_own_hostnames(make):
    m = make(3)
    slot = m.cluster.provider_state["slot"]
    for i, node in enumerate(m.cluster.nodes, start=1):
        assert (node.name, node.index, node.address, node.ssh_host, node.ssh_port, node.slots) == (
            f"node-{i}", i, f"10.213.{slot}.{i}", f"10.213.{slot}.{i}", 22, 1)
        assert node.role == ("leader" if i == 1 else "member")
        assert node.host_keys and node.host_keys[0].startswith("ecdsa-sha2-nistp256 ")
        result = m.ssh(i, "hostname")
        assert (result.returncode, result.stdout.strip()) == (0, f"node-{i}"), result.stderr
    assert [n.state for n in m.provider.query_instances(m.cluster)] == ["running"] * 3
    assert_route_matches_bridges()


def test_a_wrong_pinned_host_key_is_refused(make):
    m = make(2)
    m.known_hosts.write_text(f"{m.cluster.nodes[0].address} {m.cluster.nodes[1].host_keys[0]}\n")
    result = m.ssh(1, "true")
    assert result.returncode == 255
    assert "host key" in result.stderr.lower()


def test_homes_are_private_per_node(make, tmp_path):
    m = make(2)
    assert m.ssh(1, "echo secret > ~/marker && test -f ~/.ssh/authorized_keys").returncode == 0
    assert m.ssh(1, "cat ~/marker").stdout.strip() == "secret"
    assert m.ssh(2, "test -e ~/marker").returncode == 1
    assert m.ssh(2, "test -f ~/.ssh/authorized_keys").returncode == 0
    assert (m.files / "local" / "node-1" / "home" / "marker").exists()
    assert not Path("/root/marker").exists()


@pytest.mark.parametrize("directory", ["/scratch", "/tmp", "/dev/shm"])
def test_scratch_tmp_and_shm_are_private_per_node(make, directory):
    m = make(2)
    name = f"{directory}/ct-private-{m.cluster.name}"
    assert m.ssh(1, f"echo x > {name} && test -f {name}").returncode == 0
    assert m.ssh(2, f"test -e {name}").returncode == 1
    assert not Path(name).exists()  # nor on the host


def test_node_names_resolve_inside_the_cluster(make):
    m = make(2)
    result = m.ssh(1, "getent ahostsv4 node-2")  # IPv4 (getent hosts prefers the ::ffff: name, for PyTorch's store)
    assert result.stdout.split()[0] == m.cluster.nodes[1].address
    mapped = m.ssh(1, "getent hosts node-2").stdout.split()[0]
    assert mapped in (m.cluster.nodes[1].address, f"::ffff:{m.cluster.nodes[1].address}")


def test_pkill_python_on_one_node_leaves_other_nodes_and_itself_alive(make):
    m = make(2)
    sleeper = "setsid python3 -c 'import time; time.sleep(120)' </dev/null >/dev/null 2>&1 &"
    for i in (1, 2):
        assert m.ssh(i, sleeper).returncode == 0

    def pythons(i: int) -> list[int]:
        pids = sysops.pids_in_netns([m.netns(i)])[m.netns(i)]
        return [p for p in pids if (sysops.comm(p) or "").startswith("python")]

    deadline = time.monotonic() + 5
    while not (pythons(1) and pythons(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pythons(1) and pythons(2)
    m.ssh(1, "pkill -9 python; sleep 0.2")
    assert pythons(1) == []
    assert len(pythons(2)) == 1
    assert m.ssh(1, "hostname").stdout.strip() == "node-1"  # its PID 1 and sshd survived
    assert m.ssh(1, "cat /proc/1/comm").stdout.strip() == "ct-init"


def test_link_rate_limits_throughput_between_nodes(make):
    m = make(2, link_rate="20mbit")
    size = 2 * 1024 * 1024  # 2 MiB over two 20 mbit hops: ~0.84 s at line rate
    server_addr = m.cluster.nodes[1].address
    server = m.in_node(2, sys.executable, "-c", (
        "import socket; s = socket.create_server(('%s', 5001)); print('ready', flush=True); "
        "c, _ = s.accept(); n = 0\n"
        "while (b := c.recv(65536)): n += len(b)\n"
        "c.sendall(str(n).encode()); c.close()") % server_addr)
    assert server.stdout.readline().strip() == "ready"
    client = m.in_node(1, sys.executable, "-c", (
        "import socket, time; c = socket.create_connection(('%s', 5001)); t = time.monotonic(); "
        "c.sendall(b'x' * %d); c.shutdown(socket.SHUT_WR); got = c.recv(64); "
        "print(got.decode(), time.monotonic() - t)") % (server_addr, size))
    out, err = client.communicate(timeout=30)
    server.wait(timeout=10)
    received, elapsed = out.split()
    assert int(received) == size, err
    assert 0.6 < float(elapsed) < 5.0, f"2 MiB at 20mbit took {elapsed}s"
    qdiscs = sysops.run(["tc", "-n", m.netns(1), "qdisc", "show", "dev", "eth0"]).stdout
    assert "tbf" in qdiscs and "rate 20Mbit" in qdiscs


def _netem_available() -> bool:
    return sysops.run(net.netem_probe_argv(), check=False).returncode == 0


@pytest.mark.skipif(not _netem_available(), reason="kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM)")
def test_link_delay_adds_latency_at_both_ends_of_each_link(make):
    m = make(1, link_delay="10ms")
    node = m.cluster.nodes[0]
    rtts = []
    for _ in range(5):  # a TCP handshake from the host: host-side veth egress + the node's eth0 egress
        t0 = time.monotonic()
        socket.create_connection((node.address, 22), timeout=5).close()
        rtts.append(time.monotonic() - t0)
    assert 0.019 < min(rtts) < 0.2, rtts


@pytest.mark.skipif(_netem_available(), reason="this kernel has netem; the refusal is for kernels without it")
def test_link_delay_without_netem_is_refused_in_one_line_before_anything_is_made(make):
    m = make(2, up=False, link_delay="5ms")
    with pytest.raises(MissingPrerequisite) as info:
        m.provider.check(m.request)
    assert "netem" in info.value.message and "\n" not in info.value.message
    assert m.cluster.provider_state == {}


def test_terminate_leaves_nothing_behind(make):
    m = make(3, up=False)
    before = snapshot(m)
    assert before == {"netns": [], "links": [], "processes": [], "node_dirs": []}
    m.up()
    during = snapshot(m)
    assert len(during["netns"]) == 3 and len(during["links"]) == 4  # 3 veths + bridge
    # one PID 1 per node; sshd listeners (plus a short-lived child per readiness probe)
    assert during["processes"].count("ct-init") == 3 and during["processes"].count("sshd") >= 3
    assert len(during["node_dirs"]) == 3
    token = m.cluster.provider_state["token"]
    lines = m.provider.terminate_instances(m.cluster)
    m.cluster.provider_state["token"] = token  # snapshot by the same tag as before
    assert snapshot(m) == before
    assert any("network namespaces" in line for line in lines)
    assert any("bridge" in line for line in lines)
    assert [n.state for n in m.provider.query_instances(m.cluster)] == ["terminated"] * 3
    assert m.provider.terminate_instances(m.cluster) == []  # idempotent
    assert_route_matches_bridges()


@pytest.mark.parametrize("step", ["make_network", "start_node"])
def test_an_interrupted_run_instances_is_fully_undone_from_saved_state(make, monkeypatch, step):
    m = make(3, up=False)
    real = getattr(nodes, step)
    calls = []

    def interrupted(cluster, *args):
        calls.append(args)
        if step == "make_network" or len(calls) == 3:  # after the network / after node 2
            if step == "make_network":
                real(cluster, *args)
            raise KeyboardInterrupt
        return real(cluster, *args)

    monkeypatch.setattr(nodes, step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        m.provider.run_instances(m.request)
    assert snapshot(m)["netns"]  # something was made
    # A new process would only have the last saved state: undo from that.
    reloaded = ClusterRecord.from_dict(json.loads(m.saved[-1]))
    m.provider.terminate_instances(reloaded)
    m.cluster.provider_state["token"] = json.loads(m.saved[-1])["provider_state"]["token"]
    assert snapshot(m) == {"netns": [], "links": [], "processes": [], "node_dirs": []}
    assert local_leftovers(m.cluster.name) == []


def test_stop_keeps_home_and_scratch_and_start_brings_nodes_back_with_empty_tmp(make):
    m = make(2)
    assert m.ssh(1, "echo h > ~/keep; echo s > /scratch/keep; echo t > /tmp/gone").returncode == 0
    m.provider.stop_instances(m.cluster)
    assert [n.state for n in m.provider.query_instances(m.cluster)] == ["stopped"] * 2
    assert m.ssh(1, "true", timeout=10).returncode == 255
    m.provider.start_instances(m.cluster)
    assert [n.state for n in m.provider.query_instances(m.cluster)] == ["running"] * 2
    result = m.ssh(1, "cat ~/keep /scratch/keep; test -e /tmp/gone; echo $?")
    assert result.stdout.split() == ["h", "s", "1"]


def test_two_clusters_get_their_own_slots_and_cannot_reach_each_other(make):
    a, b = make(1), make(1)
    assert a.cluster.provider_state["slot"] != b.cluster.provider_state["slot"]
    probe = a.in_node(1, sys.executable, "-c", (
        "import socket\ntry:\n    socket.create_connection(('%s', 22), timeout=2); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)") % b.cluster.nodes[0].address)
    out, _ = probe.communicate(timeout=10)
    assert out.startswith("refused")


def test_a_node_whose_sshd_fails_is_named_with_its_log_tail(make, monkeypatch):
    real = net.sshd_config_text

    def broken(address, title):
        text = real(address, title)
        return text + "NoSuchOption yes\n" if title.endswith("node-2") else text

    monkeypatch.setattr(local.net, "sshd_config_text", broken)
    m = make(2, up=False)
    m.provider.run_instances(m.request)
    with pytest.raises(ProviderError) as info:
        m.provider.wait_instances(m.cluster, timeout=10)
    assert info.value.message.startswith("node-2 ")
    assert "NoSuchOption" in (info.value.hint or "")
