"""Making a local cluster's nodes: the slot and bridge, per-node files and host keys, the
network (veth, shaping, the members' firewall), and starting each node's PID 1 and sshd.

The provider (``__init__``) decides when; this module does it.  See ``net`` for names and argv,
``sysops`` for the system calls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from clustertool.core import state
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import LEADER, MEMBER, SERVER, ClusterRecord, Node
from clustertool.providers.base import ProvisionRequest
from clustertool.providers.local import firewall, net, sysops
from clustertool.remote.keys import keygen_argv

INIT_SCRIPT = Path(__file__).with_name("init.py")
LAUNCHED: dict[int, subprocess.Popen] = {}  # node launchers started by this process


def reap_launched() -> None:
    for pid, proc in list(LAUNCHED.items()):
        if proc.poll() is not None:
            del LAUNCHED[pid]


def allocate(request: ProvisionRequest) -> int:
    """Under the system-wide lock: pick a slot, make its bridge, the guard route, /scratch."""
    ps = request.cluster.provider_state
    tag = net.link_tag(request.cluster.name, ps["token"])
    with sysops.global_lock():
        slot = net.first_free_slot(net.slots_in_use(sysops.bridge_names()))
        if slot is None:
            raise ProviderError("all local cluster slots (0..250) are in use",
                                hint="bring some local clusters down")
        ps["slot"], ps["bridge"] = slot, net.bridge_name(slot)
        request.save()
        alias = net.bridge_alias(tag, state.home_id(), request.cluster.id)
        sysops.run_batch(net.ip_batch_argv(), net.bridge_lines(slot, alias))
        sysops.run(net.route_add_argv())
        ps["route"] = True
        sysops.ensure_scratch()
        request.save()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    return slot

def write_node_files(request: ProvisionRequest, slot: int,
                      indices: list[int]) -> dict[int, subprocess.Popen]:
    """Per-node directories, sshd_config, authorized_keys; host keys made in parallel."""
    nodes_dir = Path(request.cluster.provider_state["nodes_dir"])
    nodes_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(nodes_dir, 0o700)  # host private keys live here
    hosts = nodes_dir / "hosts"
    count = request.count
    hosts.write_text(net.hosts_text([(node_name(i, count), net.node_address(slot, i)) for i in indices]))
    os.chmod(hosts, 0o644)
    return {i: write_node_dir(request.cluster.name, slot, i, node_name(i, count), nodes_dir / node_name(i, count),
                              request.public_key) for i in indices}


def write_node_dir(cluster_name: str, slot: int, i: int, name: str, node_dir: Path, public_key: str,
                   final_dir: Path | None = None) -> subprocess.Popen:
    """One node's directory (home, /scratch, /tmp, /etc/ssh, init.json) at ``node_dir``, its host key
    made by the returned ssh-keygen; ``final_dir``: where the directory will be when the node
    starts (a replacement is made aside, then moved into place), default ``node_dir``."""
    node_dirs(node_dir, public_key)
    etc_ssh = node_dir / "ssh"
    seed_etc_ssh(etc_ssh)
    (etc_ssh / "sshd_config").write_text(net.sshd_config_text(net.node_address(slot, i), f"{cluster_name} {name}"))
    final = final_dir or node_dir
    init = net.init_config(name, final, final.parent / "hosts", shared=host_software())
    (node_dir / "init.json").write_text(json.dumps(init, indent=1))
    key = etc_ssh / net.HOST_KEY
    for old in (key, key.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    return subprocess.Popen(keygen_argv(key, f"{cluster_name}-{name}"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

def node_dirs(node_dir: Path, public_key: str) -> None:
    ssh = node_dir / "home" / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(node_dir / "home", 0o700)
    os.chmod(ssh, 0o700)
    auth = ssh / "authorized_keys"
    auth.write_text(public_key.strip() + "\n")
    os.chmod(auth, 0o600)
    (node_dir / "scratch").mkdir(exist_ok=True)
    (node_dir / "tmp").mkdir(exist_ok=True)
    os.chmod(node_dir / "tmp", 0o1777)

def make_network(cluster: ClusterRecord, slot: int, indices: list[int], peers: list[int] | None = None) -> None:
    """Namespaces, veths, shaping and the members' firewall for nodes ``indices``; ``peers``: every
    node index of the cluster (default ``indices``: `up` makes them all at once; a replacement one)."""
    peers = peers or indices
    tag = net.link_tag(cluster.name, cluster.provider_state["token"])
    host_lines = [line for i in indices for line in net.host_node_lines(cluster.name, slot, i, tag)]
    sysops.run_batch(net.ip_batch_argv(), host_lines)
    rate, delay = link_options(cluster)
    jobs = []
    for i in indices:
        ns = net.netns_name(cluster.name, i)
        jobs.append((net.ip_batch_argv(ns), "\n".join(net.node_lines(slot, i, max(peers))) + "\n"))
        node_tc = net.shaping_lines(net.NODE_IFACE, rate, delay)
        if node_tc:
            jobs.append((net.tc_batch_argv(ns), "\n".join(node_tc) + "\n"))
    host_tc = [line for i in indices for line in net.shaping_lines(net.veth_name(slot, i), rate, delay)]
    if host_tc:
        jobs.append((net.tc_batch_argv(), "\n".join(host_tc) + "\n"))
    if behind_leader(cluster) and len(peers) > 1:
        rules = firewall.member_ruleset([net.node_address(slot, i) for i in peers])
        jobs += [(firewall.nft_argv(net.netns_name(cluster.name, i)), rules) for i in indices if i != 1]
    for start in range(0, len(jobs), 16):  # bounded parallelism: the machine has few cores
        sysops.run_parallel(jobs[start:start + 16])

def collect_host_keys(nodes_dir: Path, keygens: dict[int, subprocess.Popen], count: int) -> dict[int, list[str]]:
    keys = {}
    for i, proc in keygens.items():
        _, err = proc.communicate(timeout=60)
        name = node_name(i, count)
        if proc.returncode != 0:
            raise ProviderError(f"ssh-keygen failed for {name}: {err.decode(errors='replace').strip()}")
        pub = (nodes_dir / name / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()
        keys[i] = [f"{pub[0]} {pub[1]}"]
    return keys

def make_node(slot: int, i: int, count: int, slots: int | None, host_keys: list[str], nodes_dir: Path) -> Node:
    address = net.node_address(slot, i)
    name = node_name(i, count)
    role = SERVER if i > count else LEADER if i == 1 else MEMBER
    return Node(name=name, index=i, address=address, role=role,
                slots=0 if role == SERVER else slots or 1, ssh_host=address, ssh_port=22, state="running",
                instance_id=None, host_keys=host_keys, extra={"log": str(nodes_dir / name / "node.log")})

def start_node(cluster: ClusterRecord, index: int) -> int:
    """Launch node ``index`` (its PID 1 and sshd) in a new session; return the launcher pid."""
    node_dir = Path(cluster.provider_state["nodes_dir"]) / node_name(index, cluster.provider_state["count"])
    argv = net.node_start_argv(net.netns_name(cluster.name, index), sys.executable,
                               INIT_SCRIPT, node_dir / "init.json")
    with open(node_dir / "node.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=net.node_environment(os.environ))
    LAUNCHED[proc.pid] = proc
    return proc.pid

def behind_leader(cluster: ClusterRecord) -> bool:
    return cluster.options.get("access") == "leader"

def link_options(cluster: ClusterRecord) -> tuple[str | None, str | None]:
    values: list[str | None] = []
    for key, parse in (("link_rate", net.rate_bits), ("link_delay", net.delay_seconds)):
        value = cluster.options.get(key)
        if value in (None, ""):
            values.append(None)
            continue
        try:
            parse(str(value))
        except ValueError as exc:
            raise UsageError(f"option {key}: {exc}") from None
        values.append(str(value))
    return values[0], values[1]


def node_name(index: int, count: int) -> str:
    """node-1..node-<count> for workers, then server-1, server-2 ... for the indices past them."""
    return f"node-{index}" if index <= count else f"server-{index - count}"


def servers_of(cluster: ClusterRecord) -> int:
    value = cluster.options.get("reduction_servers") or 0
    if not isinstance(value, int) or value < 0:
        raise UsageError(f"option reduction_servers: expected 0 or a positive integer, got {value!r}")
    return value


def seed_etc_ssh(etc_ssh: Path, host_etc: Path = Path("/etc/ssh")) -> None:
    """A node's own /etc/ssh: the host's client config and moduli, but not its keys or sshd_config."""
    etc_ssh.mkdir(mode=0o755, exist_ok=True)
    for entry in host_etc.iterdir():
        if entry.name.startswith(("ssh_host_", "sshd_config")) or (etc_ssh / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, etc_ssh / entry.name, symlinks=True)
        elif entry.is_file():
            try:
                os.link(entry, etc_ssh / entry.name)  # moduli is large: share it when we can
            except OSError:
                shutil.copy2(entry, etc_ssh / entry.name)



def host_software() -> list[str]:
    """Where this clustertool and its Python live on the host (nodes share the host's software)."""
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding the clustertool package
    return net.shared_software([sys.prefix, sys.base_prefix, package_root])
