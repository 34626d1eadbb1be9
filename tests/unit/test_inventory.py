"""Inventory export: Ansible INI groups, JSON, ssh-config; all through the pinned ssh_config."""

from __future__ import annotations

import configparser
import json
import shlex

import pytest

from clustertool.cluster import inventory
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node

pytestmark = pytest.mark.unit


@pytest.fixture
def cluster(ct_env):
    nodes = [Node("node-2", 2, "10.0.0.12", slots=8, ssh_host="54.1.1.2", instance_id="i-2"),
             Node("node-1", 1, "10.0.0.11", role=LEADER, slots=8, ssh_host="54.1.1.1", instance_id="i-1"),
             Node("node-3", 3, "10.0.0.13", slots=8)]
    return ClusterRecord("gpu-run", "aws", user="ubuntu", nodes=nodes)


def test_ansible_groups_leader_first_and_pinned_ssh(cluster):
    text = inventory.render(cluster, "ansible")
    parser = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(text.replace(" ansible_host", "=ansible_host", ))
    assert parser.sections() == ["gpu_run_leader", "gpu_run_members", "gpu_run:children", "gpu_run:vars"]
    assert list(parser["gpu_run_leader"]) == ["node-1"]
    assert list(parser["gpu_run_members"]) == ["node-2", "node-3"]
    assert "ansible_host=gpu-run-node-1 private_address=10.0.0.11 slots=8" in text
    args = shlex.split(shlex.split(parser["gpu_run:vars"]["ansible_ssh_common_args"])[0])
    assert args[0] == "-F" and args[1].endswith("clusters/gpu-run/ssh_config")
    assert parser["gpu_run:vars"]["ansible_user"] == "ubuntu"
    assert "StrictHostKeyChecking=no" not in text


def test_json_lists_nodes_in_hostfile_order(cluster):
    data = json.loads(inventory.render(cluster, "json"))
    assert [n["name"] for n in data["nodes"]] == ["node-1", "node-2", "node-3"]
    assert data["nodes"][0] == {"name": "node-1", "role": "leader", "address": "10.0.0.11",
                                "ssh_alias": "gpu-run-node-1", "ssh_host": "54.1.1.1", "ssh_port": 22,
                                "proxy_jump": None, "slots": 8, "instance_id": "i-1"}
    assert data["nodes"][2]["ssh_host"] == "10.0.0.13"  # no public address: the private one
    assert data["ssh_config"].endswith("ssh_config") and data["user"] == "ubuntu"


def test_ssh_config_has_every_alias_and_keeps_host_keys_strict(cluster):
    text = inventory.render(cluster, "ssh-config")
    assert "Host gpu-run-node-1 gpu-run-leader" in text
    assert "Host gpu-run-node-3" in text and "HostName 10.0.0.13" in text
    assert "StrictHostKeyChecking yes" in text


def test_unknown_format(cluster):
    with pytest.raises(UsageError, match="expected one of ansible, json, ssh-config"):
        inventory.render(cluster, "yaml")
