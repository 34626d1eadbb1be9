"""Members behind the leader: the access modes, the ssh_config and argv that carry them, and the
local provider's model of them (nftables in members' namespaces). No network: `ssh -G` resolves
the rendered config the way ssh itself will."""

from __future__ import annotations

import json
import subprocess

import pytest

from clustertool.cluster import inventory
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node
from clustertool.core.state import ClusterPaths
from clustertool.providers.local import firewall
from clustertool.remote import access, keys, mesh, transport

pytestmark = pytest.mark.unit


def _cluster(mode: str = "leader", jump: str | None = None) -> ClusterRecord:
    nodes = [Node("node-1", 1, "10.0.0.11", role=LEADER, ssh_host="54.1.1.1", host_keys=["ssh-ed25519 AAAA1"]),
             Node("node-2", 2, "10.0.0.12", host_keys=["ssh-ed25519 AAAA2"]),
             Node("node-3", 3, "10.0.0.13", ssh_host="10.0.0.13", host_keys=["ssh-ed25519 AAAA3"])]
    options = {"access": mode}
    if jump:
        options["jump"] = jump
    return ClusterRecord("gpu", "aws", user="ubuntu", nodes=nodes, options=options,
                   jump_keys=["ssh-ed25519 BASTION"] if jump else [])


def _resolved(cluster: ClusterRecord, host: str) -> dict[str, str]:
    """What ssh makes of the cluster's config for ``host`` (ssh -G: no connection)."""
    path = transport.write_ssh_config(cluster)
    out = subprocess.run(["ssh", "-G", "-F", str(path), host], capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines() if " " in line}


def test_parse_jump_takes_user_host_and_port_and_refuses_the_rest():
    assert access.parse_jump("ec2-user@bastion.example.com") == access.Jump("ec2-user", "bastion.example.com", 22)
    assert access.parse_jump("ops@10.1.2.3:2200") == access.Jump("ops", "10.1.2.3", 2200)
    assert str(access.parse_jump("ops@10.1.2.3:2200")) == "ops@10.1.2.3:2200"
    assert access.parse_jump("bastion").host == "bastion"  # the local user name by default
    for bad in ("", "a b@host", "ops@host:0", "ops@host:99999", "ops@-oProxyCommand=x", "ops@-oFoo", "ops@host;rm"):
        with pytest.raises(UsageError):
            access.parse_jump(bad)


def test_states_without_an_access_mode_are_all_and_unknown_modes_are_refused():
    old = _cluster()
    old.options.pop("access")
    assert access.mode(old) == "all" and access.hop(old, old.nodes[1]) is None
    with pytest.raises(UsageError):
        access.check_mode("some")


def test_leader_access_members_jump_through_the_leader_at_their_private_address(ct_env):
    cluster = _cluster()
    assert [access.hop(cluster, n) for n in cluster.nodes] == [None, "gpu-leader", "gpu-leader"]
    leader, member = _resolved(cluster, "gpu-leader"), _resolved(cluster, "gpu-node-3")
    assert leader["hostname"] == "54.1.1.1" and "proxyjump" not in leader
    assert member["hostname"] == "10.0.0.13" and member["proxyjump"] == "gpu-leader"
    assert member["hostkeyalias"] == "gpu-node-3" and member["stricthostkeychecking"] == "true"
    assert member["controlmaster"] == "auto" and leader["controlpersist"] != "no"
    text = transport.render_ssh_config(cluster, ClusterPaths("gpu"))
    assert "StrictHostKeyChecking no" not in text and "access: leader" in text.splitlines()[0]


def test_a_single_node_cluster_has_nothing_behind_its_leader():
    cluster = _cluster()
    cluster.nodes = cluster.nodes[:1]
    assert access.hop(cluster, cluster.nodes[0]) is None


def test_all_access_reaches_every_node_directly(ct_env):
    cluster = _cluster("all")
    assert "proxyjump" not in _resolved(cluster, "gpu-node-3")
    assert "ProxyJump" not in transport.render_ssh_config(cluster, ClusterPaths("gpu"))


def test_jump_puts_the_bastion_first_with_its_pinned_key_and_the_users_keys(ct_env):
    cluster = _cluster("leader", "ops@bastion.example.com:2200")
    bastion, leader, member = (_resolved(cluster, h) for h in ("gpu-jump", "gpu-leader", "gpu-node-2"))
    assert (bastion["hostname"], bastion["port"], bastion["user"]) == ("bastion.example.com", "2200", "ops")
    assert bastion["identitiesonly"] == "no" and bastion["stricthostkeychecking"] == "true"
    assert bastion["hostkeyalias"] == "gpu-jump"
    assert leader["hostname"] == "10.0.0.11" and leader["proxyjump"] == "gpu-jump"  # private subnet
    assert member["proxyjump"] == "gpu-leader" and member["user"] == "ubuntu"
    assert "gpu-jump ssh-ed25519 BASTION" in keys.local_known_hosts(cluster).splitlines()
    every = _cluster("all", "ops@bastion.example.com")
    assert {access.hop(every, n) for n in every.nodes} == {"gpu-jump"}


def test_proxy_jumps_read_back_from_the_rendered_config(ct_env):
    cluster = _cluster("leader", "ops@b")
    jumps = transport.proxy_jumps(transport.render_ssh_config(cluster, ClusterPaths("gpu")))
    assert jumps == {"gpu-node-1": "gpu-jump", "gpu-leader": "gpu-jump", "gpu-node-2": "gpu-leader",
                     "gpu-node-3": "gpu-leader"}
    argv = transport.master_argv("gpu", "gpu-leader")
    assert argv[:3] == ["ssh", "-F", str(ClusterPaths("gpu").ssh_config)] and argv[-3:] == ["--", "gpu-leader", "true"]


def test_inventory_says_how_each_node_is_reached(ct_env):
    cluster = _cluster()
    data = json.loads(inventory.render(cluster, "json"))
    assert data["access"] == "leader" and data["jump"] is None
    assert [(n["ssh_host"], n["proxy_jump"]) for n in data["nodes"]] == [
        ("54.1.1.1", None), ("10.0.0.12", "gpu-leader"), ("10.0.0.13", "gpu-leader")]
    ansible = inventory.render(cluster, "ansible")
    assert "ansible_ssh_common_args=" in ansible and "# access: leader" in ansible
    assert "ProxyJump gpu-leader" in inventory.render(cluster, "ssh-config")


def test_members_ruleset_refuses_ssh_from_all_but_the_clusters_nodes():
    rules = firewall.member_ruleset(["10.213.4.1", "10.213.4.2"])
    assert "tcp dport 22 ip saddr != { 10.213.4.1, 10.213.4.2 } reject with tcp reset" in rules
    assert "meta nfproto ipv6 reject" in rules and rules.startswith(f"table inet {firewall.TABLE} {{")
    assert firewall.nft_argv("ct-a-2") == ["ip", "netns", "exec", "ct-a-2", "nft", "-f", "-"]
    argv = firewall.probe_argv("ct-a-1", "/usr/bin/python3", ["10.213.4.2"], 5)
    assert argv[:6] == ["ip", "netns", "exec", "ct-a-1", "/usr/bin/python3", "-c"]
    assert argv[-3:] == ["22", "5", "10.213.4.2"]


def test_the_leader_waits_for_members_ports_and_names_the_silent_ones():
    script = mesh.port_wait_script([Node("node-2", 2, "10.0.0.12"), Node("node-3", 3, "10.0.0.13", ssh_port=2222)],
                                   timeout=10)
    assert "/dev/tcp/'10.0.0.12'/22" in script and "/dev/tcp/'10.0.0.13'/2222" in script
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert mesh.failed_targets("fail 10.0.0.13 port 2222 not answering after 10s\n") == {
        "10.0.0.13": "port 2222 not answering after 10s"}


def test_keyscan_through_the_leader_and_the_users_known_hosts_lookup():
    assert keys.parse_keyscan("# 10.0.0.12:22 SSH-2.0\n10.0.0.12 ssh-ed25519 AAAA2\n") == ["ssh-ed25519 AAAA2"]
    assert keys.known_hosts_argv("b.example", 22, "/k") == ["ssh-keygen", "-F", "b.example", "-f", "/k"]
    assert keys.known_hosts_argv("b.example", 2200, "/k")[2] == "[b.example]:2200"
