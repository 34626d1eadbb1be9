"""ssh config, argv and known_hosts: pinned keys, never StrictHostKeyChecking=no."""

import os
import stat
import subprocess

import pytest

from clustertool.core.model import ClusterRecord, Node
from clustertool.core.state import ClusterPaths
from clustertool.remote import keys, transport

pytestmark = pytest.mark.unit


def _cluster():
    nodes = [Node("node-1", 1, "10.1.0.1", role="leader", host_keys=["ssh-ed25519 AAAAleader"]),
             Node("node-2", 2, "10.1.0.2", ssh_host="54.1.2.3", ssh_port=2222, host_keys=["ssh-ed25519 AAAAm2"])]
    return ClusterRecord(name="demo", provider="local", nodes=nodes)


def test_config_pins_host_keys_and_multiplexes(ct_env):
    text = transport.render_ssh_config(_cluster(), ClusterPaths("demo"))
    assert "StrictHostKeyChecking yes" in text
    assert "StrictHostKeyChecking no" not in text
    assert "Host demo-node-1 demo-leader" in text
    assert "HostName 54.1.2.3" in text and "Port 2222" in text
    assert "ControlMaster auto" in text and "BatchMode yes" in text


def test_each_host_offers_only_the_algorithms_of_its_pinned_keys_p256_first():
    pinned = ["ssh-rsa AAAAr", "ssh-ed25519 AAAAe", "ecdsa-sha2-nistp256 AAAAp"]
    assert transport.host_key_algorithms(pinned) == "ecdsa-sha2-nistp256,ssh-ed25519,rsa-sha2-512,rsa-sha2-256"
    assert transport.host_key_algorithms(["ssh-ed25519 AAAAe"]) == "ssh-ed25519"
    assert transport.host_key_algorithms([]) is None  # nothing pinned yet: ssh's own order
    assert transport.host_key_algorithms(["ssh-dss AAAAd", "ssh-ed25519 AAAAe"]) is None  # a type we don't rank


def test_the_config_names_each_nodes_host_key_algorithms(ct_env):
    cluster = _cluster()
    cluster.nodes[1].host_keys = ["ssh-ed25519 AAAAm2", "ecdsa-sha2-nistp256 AAAAp2"]
    blocks = transport.render_ssh_config(cluster, ClusterPaths("demo")).split("\nHost ")
    assert "  HostKeyAlgorithms ssh-ed25519" in blocks[1].splitlines()
    assert "  HostKeyAlgorithms ecdsa-sha2-nistp256,ssh-ed25519" in blocks[2].splitlines()


def test_key_exchange_prefers_p256_to_curve25519_and_never_offers_sha1(monkeypatch):
    monkeypatch.delenv("CLUSTERTOOL_SSH_KEX", raising=False)
    transport.kex_algorithms.cache_clear()
    chosen = transport.kex_algorithms().split(",")
    transport.kex_algorithms.cache_clear()
    assert chosen.index("ecdh-sha2-nistp256") < chosen.index("curve25519-sha256")
    assert not any("sha1" in k for k in chosen)


def test_a_new_cluster_key_is_p256_and_an_older_clusters_ed25519_key_is_kept(ct_env):
    fresh = keys.ensure_keypair("fresh")
    assert fresh.key.name == "id_ecdsa" and fresh.pubkey.read_text().startswith("ecdsa-sha2-nistp256 ")
    older = ClusterPaths("older")
    older.root.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(older.root / "id_ed25519")], check=True)
    assert keys.ensure_keypair("older").key == older.root / "id_ed25519"
    assert older.pubkey.read_text().startswith("ssh-ed25519 ")
    assert not (older.root / "id_ecdsa").exists()


def test_an_aws_cluster_key_is_ed25519_because_ec2_imports_no_ecdsa_key_pair(ct_env):
    from clustertool.providers.aws.aws_provider import AwsProvider

    paths = keys.ensure_keypair("onaws", AwsProvider.key_type)
    assert paths.key.name == "id_ed25519" and paths.pubkey.read_text().startswith("ssh-ed25519 ")
    assert (paths.key.stat().st_mode & 0o777) == 0o600


def test_ssh_argv_passes_the_command_as_one_word(ct_env):
    argv = transport.ssh_argv("demo", _cluster().nodes[0], "echo 'a b'; true")
    assert argv[:3] == ["ssh", "-F", str(ClusterPaths("demo").ssh_config)]
    assert argv[-3:] == ["--", "demo-node-1", "echo 'a b'; true"]


def test_local_known_hosts_keyed_by_alias():
    assert keys.local_known_hosts(_cluster()).splitlines() == [
        "demo-node-1 ssh-ed25519 AAAAleader", "demo-node-2 ssh-ed25519 AAAAm2"]


def test_node_known_hosts_uses_private_address_and_port_brackets():
    lines = keys.node_known_hosts(_cluster()).splitlines()
    assert lines[0].startswith("10.1.0.1,node-1,demo-node-1,demo-leader ")
    assert lines[1].startswith("[10.1.0.2]:2222,node-2,demo-node-2 ")


@pytest.mark.parametrize("stderr,expected", [
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", "CHANGED"),
    ("ssh: connect to host 10.1.0.9 port 22: Connection refused", "connection refused"),
    ("ssh: connect to host x port 22: No route to host", "no route"),
    ("root@x: Permission denied (publickey).", "permission denied"),
])
def test_ssh_failures_become_one_line_reasons(stderr, expected):
    assert expected in transport.classify_ssh_failure(stderr)


def test_command_output_is_not_mistaken_for_an_ssh_failure():
    assert transport.classify_ssh_failure("my program failed\n") is None


PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n"
PUBLIC = "ssh-ed25519 AAAApub c"


def _on_node(script: str, home) -> None:
    """Run a node program the way a node gets it (sh, on stdin) with ``home`` as its home."""
    subprocess.run(["sh", "-s"], input=script, text=True, check=True, capture_output=True,
                   env=dict(os.environ, HOME=str(home)))


def test_wire_script_keeps_secrets_off_the_command_line_and_is_idempotent(tmp_path):
    script = keys.wire_script(_cluster(), PRIVATE, PUBLIC, "10.1.0.1 slots=1\n")
    assert "secret" not in script  # base64 only, sent on stdin
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text("Host mine\n  User me\n")
    _on_node(script, tmp_path)
    _on_node(script, tmp_path)  # a second wiring (start, repin) changes nothing more
    key = ssh / "clustertool-demo"
    assert key.read_text() == PRIVATE and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (ssh / "clustertool-demo.known_hosts").read_text() == keys.node_known_hosts(_cluster())
    assert (ssh / "authorized_keys").read_text().splitlines() == [PUBLIC]
    config = (ssh / "config").read_text()
    assert config.count("# >>> clustertool demo >>>") == 1 and config.endswith("Host mine\n  User me\n")
    assert "KexAlgorithms " in config and "@CT_KEX@" not in config
    assert (tmp_path / "hostfile").read_text() == "10.1.0.1 slots=1\n"


def test_unwire_removes_only_what_wiring_added(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "authorized_keys").write_text("ssh-ed25519 AAAAtheirs me\n")
    (ssh / "config").write_text("Host mine\n  User me\n")
    _on_node(keys.wire_script(_cluster(), PRIVATE, PUBLIC, None), tmp_path)
    warm = tmp_path / ".clustertool" / "warm"   # a warm node launcher's socket: it ends once that is gone
    warm.mkdir(parents=True)
    (warm / "0123456789abcdef.sock").write_text("")
    _on_node(keys.unwire_script(_cluster(), PUBLIC), tmp_path)
    assert sorted(p.name for p in ssh.iterdir()) == ["authorized_keys", "config"]
    assert list(warm.iterdir()) == []
    assert (ssh / "authorized_keys").read_text() == "ssh-ed25519 AAAAtheirs me\n"
    assert (ssh / "config").read_text() == "Host mine\n  User me\n"
