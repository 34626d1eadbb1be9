"""ssh config, argv and known_hosts: pinned keys, never StrictHostKeyChecking=no."""

import pytest

from clustertool.model import Cluster, Node
from clustertool.remote import keys, transport
from clustertool.state import ClusterPaths

pytestmark = pytest.mark.unit


def _cluster():
    nodes = [Node("node-1", 1, "10.1.0.1", role="leader", host_keys=["ssh-ed25519 AAAAleader"]),
             Node("node-2", 2, "10.1.0.2", ssh_host="54.1.2.3", ssh_port=2222, host_keys=["ssh-ed25519 AAAAm2"])]
    return Cluster(name="demo", provider="local", nodes=nodes)


def test_config_pins_host_keys_and_multiplexes(ct_env):
    text = transport.render_ssh_config(_cluster(), ClusterPaths("demo"))
    assert "StrictHostKeyChecking yes" in text
    assert "StrictHostKeyChecking no" not in text
    assert "Host demo-node-1 demo-leader" in text
    assert "HostName 54.1.2.3" in text and "Port 2222" in text
    assert "ControlMaster auto" in text and "BatchMode yes" in text


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


def test_wire_script_keeps_secrets_off_the_command_line_and_is_idempotent():
    script = keys.wire_script(_cluster(), "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n", "ssh-ed25519 AAAApub c", None)
    assert "secret" not in script  # base64 only, sent on stdin
    assert "grep -qxF" in script  # authorized_keys line added once
    assert "chmod 600 ~/.ssh/clustertool-demo" in script
