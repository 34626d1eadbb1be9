"""Cluster.fabric()'s connections, without connecting: pinned keys under the names paramiko looks up,
RejectPolicy, only the cluster key; and the API's small conversions."""

from __future__ import annotations

import subprocess

import pytest

from clustertool import api
from clustertool.core import state
from clustertool.core.errors import StateError
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs.jobrequests import RunRequest
from clustertool.remote import fabricgroup
from clustertool.remote.remoterequests import ExecRequest
from tests.fakes.cluster import saved_cluster

pytestmark = pytest.mark.unit


def keypair(path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def test_keys_pinned_under_host_key_aliases_map_to_their_nodes():
    cluster = ClusterRecord("c", "static", nodes=[Node("node-1", 1, "10.0.0.1", role="leader"),
                                            Node("node-2", 2, "10.0.0.2")])
    text = ("c-node-1 ssh-ed25519 AAAA1\n# a comment\nc-node-2 ssh-ed25519 AAAA2\n"
            "c-node-2,other ecdsa-sha2-nistp256 BBBB2\nother-node-3 ssh-ed25519 CCCC\n@revoked c-node-1 x y\n")
    assert fabricgroup.pinned_lines(cluster, text) == {
        "node-1": ["ssh-ed25519 AAAA1"], "node-2": ["ssh-ed25519 AAAA2", "ecdsa-sha2-nistp256 BBBB2"]}


def test_paramiko_looks_a_key_up_by_host_or_bracketed_host_and_port():
    plain = ClusterRecord("c", "static", nodes=[Node("node-1", 1, "10.0.0.1", role="leader")])
    assert fabricgroup.lookup_name(plain, plain.nodes[0]) == "10.0.0.1"
    far = Node("node-1", 1, "10.0.0.1", ssh_host="3.3.3.3", ssh_port=2222)
    assert fabricgroup.lookup_name(plain, far) == "[3.3.3.3]:2222"


def test_members_behind_the_leader_connect_through_one_leader_connection_at_their_private_address(ct_env, tmp_path):
    import paramiko

    cluster = saved_cluster("fabl", 3)
    cluster.options["access"] = "leader"
    cluster.nodes[0].ssh_host = "3.3.3.3"  # the leader's public address
    for node in cluster.nodes[1:]:
        node.ssh_host = None
    state.save(cluster)
    paths = state.ClusterPaths("fabl")
    paths.root.mkdir(parents=True, exist_ok=True)
    keys = [keypair(tmp_path / f"h{i}") for i in range(3)]
    paths.known_hosts.write_text("".join(f"fabl-node-{i + 1} {k}\n" for i, k in enumerate(keys)))
    leader, *members = list(fabricgroup.thread_group(state.load("fabl"), state.load("fabl").nodes))
    assert (leader.host, leader.gateway) == ("3.3.3.3", None)
    for conn, node, key in zip(members, cluster.nodes[1:], keys[1:]):
        assert conn.host == node.address and conn.gateway is leader
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
        assert [k.get_base64() for k in conn.client.get_host_keys()[node.address].values()] == [key.split()[1]]


def test_connections_trust_only_the_pinned_keys_and_offer_only_the_cluster_key(ct_env, tmp_path):
    import paramiko

    cluster = saved_cluster("fab", 2)
    cluster.nodes[1].ssh_port = 2222
    state.save(cluster)
    paths = state.ClusterPaths("fab")
    paths.root.mkdir(parents=True, exist_ok=True)
    one, two = keypair(tmp_path / "h1"), keypair(tmp_path / "h2")
    paths.known_hosts.write_text(f"fab-node-1 {one}\nfab-node-2 {two}\n")
    group = fabricgroup.thread_group(state.load("fab"), state.load("fab").nodes)
    first, second = list(group)
    assert (first.host, first.port, second.host, second.port) == ("10.0.0.1", 22, "10.0.0.2", 2222)
    for conn, name, key in ((first, "10.0.0.1", one), (second, "[10.0.0.2]:2222", two)):
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
        assert {n: [k.get_base64() for k in conn.client.get_host_keys()[n].values()]
                for n in conn.client.get_host_keys().keys()} == {name: [key.split()[1]]}
        assert conn.connect_kwargs["key_filename"] == [str(paths.key)]
        assert conn.connect_kwargs["look_for_keys"] is False and conn.connect_kwargs["allow_agent"] is False


def test_a_cluster_without_pinned_keys_is_said_so(ct_env):
    cluster = saved_cluster("nokeys", 1)
    with pytest.raises(StateError, match="no pinned host keys"):
        fabricgroup.thread_group(cluster, cluster.nodes)


def test_the_apis_commands_environment_and_ranks_read_as_the_clis():
    assert ExecRequest.of("python t.py --lr 0.1").command == ("python t.py --lr 0.1",)
    assert ExecRequest.of(["python", "t.py", 3]).command == ("python", "t.py", "3")
    assert RunRequest.of("x", env={"A": 1, "B": "x y"}).launch.env == ("A=1", "B=x y")
    assert RunRequest.of("x", env=["A=1", "HOME"]).launch.env == ("A=1", "HOME")
    assert RunRequest.of("python t.py --lr 0.1").command == ("python t.py --lr 0.1",)
    assert RunRequest.of(["python", "t.py", 3]).command == ("python", "t.py", "3")
    assert (api._ranks(2), api._ranks([0, 3]), api._ranks("4-7"), api._ranks(None)) == ("2", "0,3", "4-7", None)
