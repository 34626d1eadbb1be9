"""The static provider: adopt existing machines, check them, never manage them."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import ClusterRecord
from clustertool.providers import static
from clustertool.providers.base import ProvisionRequest, get_provider, provider_class
from clustertool.providers.static import StaticProvider, Target, check_key, parse_hosts

pytestmark = pytest.mark.unit


def request_for(options: dict, count: int | None = None, slots: int | None = None, tmp: Path | None = None):
    saved = []
    cluster = ClusterRecord(name="adopted", provider="static", user="me", options=dict(options))
    req = ProvisionRequest(cluster=cluster, count=count, slots=slots, public_key="ssh-ed25519 AAAA x",
                           key_path=Path("/nonexistent/key"), files_dir=Path("/nonexistent"),
                           save=lambda: saved.append(dict(cluster.provider_state)))
    req.saved = saved  # type: ignore[attr-defined]
    return req


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "mykey.pem"
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def listener():
    """A listening TCP socket on loopback, standing in for a node's sshd port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- registry and identity ----------------------------------------------------------------

def test_static_is_registered_and_adopts_rather_than_owns():
    cls = provider_class("static")
    assert cls is StaticProvider
    assert cls.name == "static" and cls.owns_machines is False
    assert set(cls.OPTIONS) == {"hosts", "hostfile", "key", "leader", "port", "servers", "slurm_login", "slurm_conf"}
    assert cls.OPTIONS["port"].default == 22


def test_default_user_is_the_current_user():
    import getpass
    assert StaticProvider.default_user == getpass.getuser()


def test_get_provider_tolerates_extra_arguments():
    assert isinstance(get_provider("static", region="x"), StaticProvider)


# --- hosts --------------------------------------------------------------------------------

def test_hosts_accept_ports_ranges_and_spaces_in_written_order():
    assert parse_hosts("b, a:2222,10.0.1.[10-11]", 22) == [
        Target("b", 22), Target("a", 2222), Target("10.0.1.10", 22), Target("10.0.1.11", 22)]


def test_hosts_use_the_port_option_as_default():
    assert parse_hosts("a", 2200) == [Target("a", 2200)]


@pytest.mark.parametrize("hosts, fragment", [
    ("a;reboot", "';'"), ("a b", "' '"), ("$(id)", "'$'"), ("a:0", "TCP port"), ("a:70000", "TCP port"),
    ("a:ssh", "TCP port"), (":22", "empty host"), ("a,,b", "empty item"), ("-oProxyCommand", "not a valid host"),
    ("300.1.1.1", "IPv4"),
])
def test_bad_hosts_are_one_line_usage_errors(hosts, fragment):
    with pytest.raises(UsageError) as info:
        StaticProvider().check(request_for({"hosts": hosts}))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_exactly_one_of_hosts_or_hostfile(tmp_path):
    hf = tmp_path / "h"
    hf.write_text("a\n")
    with pytest.raises(UsageError, match="exactly one of --hosts or --hostfile .neither"):
        StaticProvider().check(request_for({}))
    with pytest.raises(UsageError, match="exactly one of --hosts or --hostfile .both"):
        StaticProvider().check(request_for({"hosts": "a", "hostfile": str(hf)}))


def test_a_host_listed_twice_is_refused():
    with pytest.raises(UsageError, match="a:22 is listed twice"):
        StaticProvider().check(request_for({"hosts": "a,b,a"}))


def test_the_same_host_on_two_ports_is_two_machines():
    nodes = StaticProvider().run_instances(request_for({"hosts": "127.0.0.1:2201,127.0.0.1:2202"}))
    assert [(n.ssh_host, n.ssh_port) for n in nodes] == [("127.0.0.1", 2201), ("127.0.0.1", 2202)]


# --- hostfile -----------------------------------------------------------------------------

def test_hostfile_hosts_and_slots_are_adopted(tmp_path):
    hf = tmp_path / "hosts.txt"
    hf.write_text("# my instances\n10.0.0.5 slots=8\n10.0.0.6 slots=8\n10.0.0.7\n")
    req = request_for({"hostfile": str(hf), "port": 2222})
    nodes = StaticProvider().run_instances(req)
    assert [(n.name, n.address, n.slots, n.ssh_port) for n in nodes] == [
        ("node-1", "10.0.0.5", 8, 2222), ("node-2", "10.0.0.6", 8, 2222), ("node-3", "10.0.0.7", 1, 2222)]
    assert req.cluster.options["hostfile"] == str(hf.resolve())


def test_explicit_slots_override_the_hostfile(tmp_path):
    hf = tmp_path / "hosts.txt"
    hf.write_text("a:8,b:8\n")
    nodes = StaticProvider().run_instances(request_for({"hostfile": str(hf)}, slots=2))
    assert [n.slots for n in nodes] == [2, 2]


def test_a_hostfile_with_a_bad_line_names_file_and_line(tmp_path):
    hf = tmp_path / "hosts.txt"
    hf.write_text("a slots=2\nb slots=two\n")
    with pytest.raises(UsageError) as info:
        StaticProvider().check(request_for({"hostfile": str(hf)}))
    assert str(info.value).startswith(f"{hf}:2: slots must be a positive integer")


def test_a_missing_or_empty_hostfile_is_named(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        StaticProvider().check(request_for({"hostfile": str(tmp_path / "nope")}))
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    with pytest.raises(UsageError, match="lists no hosts"):
        StaticProvider().check(request_for({"hostfile": str(empty)}))


# --- leader, count, key -------------------------------------------------------------------

def test_the_first_host_leads_by_default():
    nodes = StaticProvider().run_instances(request_for({"hosts": "a,b,c"}))
    assert [(n.name, n.role, n.address, n.ssh_host, n.slots) for n in nodes] == [
        ("node-1", "leader", "a", "a", 1), ("node-2", "member", "b", "b", 1), ("node-3", "member", "c", "c", 1)]


@pytest.mark.parametrize("leader", ["c", "c:22", "node-3"])
def test_leader_names_a_host_by_name_host_port_or_node_name(leader):
    nodes = StaticProvider().run_instances(request_for({"hosts": "a,b,c", "leader": leader}))
    assert [n.name for n in nodes if n.is_leader] == ["node-3"]
    assert [n.name for n in nodes] == ["node-1", "node-2", "node-3"]


def test_a_leader_that_is_not_listed_is_refused_listing_the_hosts():
    with pytest.raises(UsageError) as info:
        StaticProvider().check(request_for({"hosts": "a,b", "leader": "z"}))
    assert str(info.value) == "--leader 'z' is not one of the hosts: a, b"


def test_an_ambiguous_leader_asks_for_host_port():
    with pytest.raises(UsageError, match="host:port"):
        StaticProvider().check(request_for({"hosts": "a:2201,a:2202", "leader": "a"}))


@pytest.mark.parametrize("count", [None, 0, 3])
def test_node_count_may_be_left_out_or_match(count):
    assert len(StaticProvider().run_instances(request_for({"hosts": "a,b,c"}, count=count))) == 3


def test_a_node_count_that_disagrees_with_the_hosts_is_refused():
    with pytest.raises(UsageError, match="--nodes 2 does not match the 3 host"):
        StaticProvider().check(request_for({"hosts": "a,b,c"}, count=2))


def test_the_key_is_recorded_as_the_clusters_initial_identity(key_file):
    req = request_for({"hosts": "a", "key": str(key_file)})
    StaticProvider().run_instances(req)
    assert req.cluster.ssh_key == str(key_file)
    assert req.cluster.provider_state == {"adopted": ["a:22"]}
    assert req.saved == [{"adopted": ["a:22"]}]


def test_without_a_key_no_identity_is_set():
    req = request_for({"hosts": "a"})
    StaticProvider().run_instances(req)
    assert req.cluster.ssh_key is None


def test_key_problems_are_named(tmp_path, key_file):
    with pytest.raises(UsageError, match="no such file"):
        check_key(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="not a regular file"):
        check_key(str(tmp_path))
    key_file.chmod(0o644)
    with pytest.raises(UsageError, match=r"readable by group or others \(mode 0644\)") as info:
        check_key(str(key_file))
    assert "chmod 600" in info.value.hint
    pub = tmp_path / "k.pub"
    pub.write_text("ssh-ed25519 AAAAC3Nza me@host\n")
    pub.chmod(0o600)
    with pytest.raises(UsageError, match="public key"):
        check_key(str(pub))


def test_check_refuses_a_bad_key_before_anything_is_made(tmp_path):
    with pytest.raises(UsageError, match="--key"):
        StaticProvider().check(request_for({"hosts": "a", "key": str(tmp_path / "missing")}))


def test_plan_describes_adoption_without_creating_anything(key_file):
    lines = StaticProvider().plan(request_for({"hosts": "a,b", "key": str(key_file), "leader": "b"}))
    assert lines[0] == "adopt node-1 = a:22, slots 1"
    assert lines[1] == "adopt node-2 = b:22 (leader), slots 1"
    assert str(key_file) in lines[2]


# --- reachability -------------------------------------------------------------------------

def cluster_of(ports: list[int]) -> ClusterRecord:
    req = request_for({"hosts": ",".join(f"127.0.0.1:{p}" for p in ports)})
    req.cluster.nodes = StaticProvider().run_instances(req)
    return req.cluster


def test_wait_passes_when_every_ssh_port_accepts(listener):
    cluster = cluster_of([listener])
    assert StaticProvider().wait_instances(cluster, timeout=5) == cluster.nodes


class ProviderClock:
    """The provider's clock (its ``time``: monotonic, sleep), moved only by the provider's own sleeps: its
    deadlines are read on it, so what a loaded box does to real seconds does not enter the test."""

    def __init__(self):
        self.now = 0.0
        self.lock = threading.Lock()

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_wait_names_the_unreachable_host_within_the_bound(listener, monkeypatch):
    """The reach bound (1 s) is the provider's own deadline: it retries the refused port until then and
    gives up there, not at the caller's 600 s; measured on the provider's clock, not in wall-clock seconds."""
    clock = ProviderClock()
    monkeypatch.setattr(static, "time", clock)
    dead = closed_port()
    cluster = cluster_of([listener, dead])
    with pytest.raises(ProviderError) as info:
        StaticProvider(reach_timeout=1.0).wait_instances(cluster, timeout=600)
    assert 1.0 <= clock.now <= 1.5, clock.now   # retried until the reach bound, gave up at it
    message = str(info.value)
    assert f"node-2 127.0.0.1:{dead} (connection refused)" in message
    assert "node-1" not in message and "\n" not in message


def test_wait_succeeds_when_a_port_opens_before_the_deadline():
    port = closed_port()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        import threading

        def open_later():
            time.sleep(0.6)
            sock.bind(("127.0.0.1", port))
            sock.listen(4)

        thread = threading.Thread(target=open_later)
        thread.start()
        StaticProvider().wait_instances(cluster_of([port]), timeout=5)
        thread.join()
    finally:
        sock.close()


def test_wait_is_skipped_when_ssh_is_not_wired():
    cluster = cluster_of([closed_port()])
    cluster.no_ssh = True
    assert StaticProvider(reach_timeout=0.2).wait_instances(cluster) == cluster.nodes


def test_query_reports_running_and_unreachable_nodes(listener):
    cluster = cluster_of([listener, closed_port()])
    assert [n.state for n in StaticProvider().query_instances(cluster)] == ["running", "unreachable"]


# --- never managed ------------------------------------------------------------------------

def test_terminate_leaves_machines_running_and_says_so():
    cluster = cluster_of([2201, 2202])
    lines = StaticProvider().terminate_instances(cluster)
    assert lines == [
        "left node-1 (127.0.0.1) running: static machines are adopted, never terminated",
        "left node-2 (127.0.0.1) running: static machines are adopted, never terminated",
    ]
    assert StaticProvider().terminate_instances(ClusterRecord("empty", "static")) == []


@pytest.mark.parametrize("verb", ["stop_instances", "start_instances"])
def test_stop_and_start_are_refused(verb):
    with pytest.raises(ProviderError, match="not managed by clustertool"):
        getattr(StaticProvider(), verb)(cluster_of([2201]))


# --- reduction servers (--servers) ------------------------------------------------------------

def test_servers_are_adopted_with_role_server_after_the_nodes_and_stay_out_of_the_hostfile():
    from clustertool.core import hostfile

    req = request_for({"hosts": "10.0.0.5,10.0.0.6", "servers": "10.0.0.9,10.0.0.10:2222"}, slots=8)
    nodes = StaticProvider().run_instances(req)
    assert [(n.name, n.role, n.slots, n.ssh_port) for n in nodes] == [
        ("node-1", "leader", 8, 22), ("node-2", "member", 8, 22), ("server-1", "server", 0, 22),
        ("server-2", "server", 0, 2222)]
    req.cluster.nodes = nodes
    assert hostfile.render_cluster(req.cluster) == "10.0.0.5 slots=8\n10.0.0.6 slots=8\n"
    assert req.cluster.provider_state["adopted"][-1] == "10.0.0.10:2222"
    plan = StaticProvider().plan(request_for({"hosts": "a,b", "servers": "c"}))
    assert "adopt server-1 = c:22 (reduction server, not a rank)" in plan


def test_a_server_that_is_also_a_node_is_refused():
    with pytest.raises(UsageError, match="b:22 is listed twice"):
        StaticProvider().check(request_for({"hosts": "a,b", "servers": "b"}))
