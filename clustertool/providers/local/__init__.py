"""The ``local`` provider: N real nodes on this machine, each in its own namespaces, running sshd.

Each node ``i`` of cluster slot ``k`` gets a network namespace ``ct-<cluster>-<i>`` (veth
``ct<k>n<i>`` on bridge ``ctbr<k>``, address ``10.213.k.i``), UTS (hostname ``node-<i>``),
mount (private /root, /scratch, /tmp, /dev/shm, /etc/hosts) and PID namespaces, with a tiny
reaper (``init.py``) as PID 1 running ``sshd -D``.  See ``net`` for names and
argv, ``sysops`` for the system calls.

Stop/start: ``stop`` kills each node's processes and keeps its namespace and directories
(home, /scratch, like a stopped instance keeps its disk); ``start`` relaunches them with a
fresh /tmp and /dev/shm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from clustertool.core import state
from clustertool.core.errors import MissingPrerequisite, ProviderError, UsageError
from clustertool.core.model import LEADER, MEMBER, SERVER, ClusterRecord, Node
from clustertool.providers.base import OptionSpec, Provider, ProvisionRequest
from clustertool.providers.local import firewall, net, sysops
from clustertool.providers.local.removal import teardown
from clustertool.remote import access
from clustertool.remote.keys import keygen_argv

INIT_SCRIPT = Path(__file__).with_name("init.py")
_TOOLS = (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"),
          ("ssh-keygen", "openssh-client"), (net.SSHD, "openssh-server"))
_LAUNCHED: dict[int, subprocess.Popen] = {}  # node launchers started by this process


def _reap_launched() -> None:
    for pid, proc in list(_LAUNCHED.items()):
        if proc.poll() is not None:
            del _LAUNCHED[pid]


def _which(tool: str) -> str | None:
    if tool.startswith("/"):
        return tool if os.access(tool, os.X_OK) else None
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(tool, path=path)


ACCESS_HELP = ("Who takes SSH from this machine: 'leader' (members only through the leader, with ProxyJump) "
               "or 'all' (default: leader on aws, all on local).")


class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    default_user: ClassVar[str] = "root"
    owns_machines: ClassVar[bool] = True
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "link_rate": OptionSpec(str, None, "egress rate at each end of every node's link, e.g. 200mbit (tc tbf)"),
        "link_delay": OptionSpec(str, None, "delay added at each end of every node's link, e.g. 5ms (tc netem); "
                                 "node to node one-way latency is twice this"),
        "access": OptionSpec(str, "all", ACCESS_HELP, ("leader", "all")),
        "jump": OptionSpec(str, None, "Your own bastion, USER@HOST[:PORT]: the leader (with --access all, every "
                                      "node) is reached through it (its host key must be in ~/.ssh/known_hosts)."),
        "reduction_servers": OptionSpec(int, 0, "K more nodes (server-1..server-K, role server) on the same bridge "
                                        "and links, for the plugin's reduction servers; not ranks"),
    }

    WAIT_LIMIT: ClassVar[float] = 60.0
    POWEROFF: ClassVar[str | None] = net.NODE_POWEROFF  # what the autostop watcher runs to power a node off
    REBOOT = "restart"  # a node is its sshd: stop and start it again

    @classmethod
    def hourly_price(cls, node_type: str, nodes: int, spot: bool) -> float | None:
        return 0.0  # namespaces on this machine

    # ---- checks and plan ------------------------------------------------------------

    def check(self, request: ProvisionRequest) -> None:
        if os.geteuid() != 0:
            raise MissingPrerequisite(
                "the local provider needs root (it makes network namespaces and runs sshd): run as root",
                hint="e.g. sudo clustertool up --provider local ...")
        missing = [(tool, pkg) for tool, pkg in _TOOLS if not _which(tool)]
        if missing:
            pkgs = sorted({pkg for _, pkg in missing})
            raise MissingPrerequisite(
                f"the local provider needs {', '.join(t for t, _ in missing)}: apt-get install {' '.join(pkgs)}")
        servers = _servers(request.cluster)
        if not 1 <= request.count + servers <= net.MAX_NODES:
            raise UsageError(f"the local provider makes 1 to {net.MAX_NODES} nodes (servers included), "
                             f"not {request.count + servers}")
        rate, delay = self._link_options(request.cluster)
        if request.cluster.options.get("jump"):
            access.parse_jump(request.cluster.options["jump"])
        if self._behind_leader(request.cluster) and not _which("nft"):
            raise MissingPrerequisite("--access leader on the local provider needs nft: apt-get install nftables")
        if delay and sysops.run(net.netem_probe_argv(), check=False).returncode != 0:
            raise MissingPrerequisite(
                "link_delay needs the kernel's netem qdisc (sch_netem), which this kernel lacks",
                hint="load it with `modprobe sch_netem`, or use link_rate alone (tbf)")
        taken = [ns for ns in sysops.netns_list() if net.netns_pattern(request.cluster.name).match(ns)]
        if taken:
            raise ProviderError(
                f"namespaces of a local cluster named {request.cluster.name!r} already exist ({taken[0]} ...)",
                hint="another CLUSTERTOOL_HOME may use this name: pick another name, or bring that one down")

    @staticmethod
    def _behind_leader(cluster: ClusterRecord) -> bool:
        return cluster.options.get("access") == "leader"

    @staticmethod
    def _link_options(cluster: ClusterRecord) -> tuple[str | None, str | None]:
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

    def plan(self, request: ProvisionRequest) -> list[str]:
        name, n = request.cluster.name, request.count
        rate, delay = self._link_options(request.cluster)
        lines = [
            "bridge ctbr<k> with 10.213.255.<k+1>/32 and a route to 10.213.<k>.0/24, k = first free slot of "
            "0..250 on this machine",
            f"{n} node(s) node-1..node-{n}: network namespace ct-{name}-<i>, veth ct<k>n<i> <-> eth0, "
            f"address 10.213.<k>.<i>",
            "each node: hostname node-<i>; private /root, /scratch, /tmp, /dev/shm; own PID namespace; "
            "sshd on port 22 (root, key only) with a fresh ECDSA P-256 host key",
            f"slots per node: {request.slots or 1}",
            *([f"{k} reduction server(s) server-1..server-{k}: namespaces ct-{name}-<{n}+j>, address "
               f"10.213.<k>.<{n}+j>, same bridge, links and sshd; role server (not in hostfiles)"]
              if (k := _servers(request.cluster)) else []),
            f"route: unreachable {net.NET_RANGE} while any local cluster exists",
        ]
        if self._behind_leader(request.cluster):
            lines.append("access: leader: node-1 takes SSH from this machine; every member's namespace rejects "
                         "TCP/22 from anything but the cluster's nodes (nftables), so members are reached through "
                         "node-1 with ProxyJump")
        else:
            lines.append("access: all: every node takes SSH from this machine")
        if rate or delay:
            what = ", ".join(x for x in (f"rate {rate}" if rate else "", f"delay {delay}" if delay else "") if x)
            lines.append(f"link shaping on both ends of each veth: {what} (node to node crosses two links)")
        return lines

    # ---- making nodes ---------------------------------------------------------------

    def run_instances(self, request: ProvisionRequest) -> list[Node]:
        cluster, ps = request.cluster, request.cluster.provider_state
        if not ps.get("token") and any(net.netns_pattern(cluster.name).match(n) for n in sysops.netns_list()):
            raise ProviderError(f"namespaces of a local cluster named {cluster.name!r} already exist",
                                hint="another CLUSTERTOOL_HOME may use this name: pick another name")
        nodes_dir = Path(request.files_dir) / "local"
        ps.setdefault("token", secrets.token_hex(4))
        ps["nodes_dir"] = str(nodes_dir)
        request.save()
        slot = self._allocate(request)
        indices = list(range(1, request.count + _servers(cluster) + 1))
        ps["count"] = request.count
        ps["servers"] = _servers(cluster)
        ps["netns"] = [net.netns_name(cluster.name, i) for i in indices]
        ps["veths"] = [net.veth_name(slot, i) for i in indices]
        request.save()
        keygens = self._write_node_files(request, slot, indices)
        self._make_network(cluster, slot, indices)
        host_keys = self._collect_host_keys(nodes_dir, keygens, request.count)
        cluster.nodes = [self._node(slot, i, request.count, request.slots, host_keys[i], nodes_dir) for i in indices]
        request.save()
        ps["pids"] = {}
        for node in cluster.nodes:
            ps["pids"][node.name] = self._start_node(cluster, node.index)
        request.save()
        what = f" and {ps['servers']} server(s)" if ps["servers"] else ""
        request.report(f"started {request.count} local node(s){what} on bridge {net.bridge_name(slot)}")
        return cluster.nodes

    def _allocate(self, request: ProvisionRequest) -> int:
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

    def _write_node_files(self, request: ProvisionRequest, slot: int,
                          indices: list[int]) -> dict[int, subprocess.Popen]:
        """Per-node directories, sshd_config, authorized_keys; host keys made in parallel."""
        nodes_dir = Path(request.cluster.provider_state["nodes_dir"])
        nodes_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(nodes_dir, 0o700)  # host private keys live here
        hosts = nodes_dir / "hosts"
        count = request.count
        hosts.write_text(net.hosts_text([(node_name(i, count), net.node_address(slot, i)) for i in indices]))
        os.chmod(hosts, 0o644)
        keygens = {}
        for i in indices:
            name = node_name(i, count)
            node_dir = nodes_dir / name
            self._node_dirs(node_dir, request.public_key)
            etc_ssh = node_dir / "ssh"
            _seed_etc_ssh(etc_ssh)
            (etc_ssh / "sshd_config").write_text(net.sshd_config_text(
                net.node_address(slot, i), f"{request.cluster.name} {name}"))
            init = net.init_config(name, node_dir, hosts, shared=_host_software())
            (node_dir / "init.json").write_text(json.dumps(init, indent=1))
            key = etc_ssh / net.HOST_KEY
            for old in (key, key.with_suffix(".pub")):
                old.unlink(missing_ok=True)
            keygens[i] = subprocess.Popen(keygen_argv(key, f"{request.cluster.name}-{name}"),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
        return keygens

    @staticmethod
    def _node_dirs(node_dir: Path, public_key: str) -> None:
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

    def _make_network(self, cluster: ClusterRecord, slot: int, indices: list[int]) -> None:
        tag = net.link_tag(cluster.name, cluster.provider_state["token"])
        host_lines = [line for i in indices for line in net.host_node_lines(cluster.name, slot, i, tag)]
        sysops.run_batch(net.ip_batch_argv(), host_lines)
        rate, delay = self._link_options(cluster)
        jobs = []
        for i in indices:
            ns = net.netns_name(cluster.name, i)
            jobs.append((net.ip_batch_argv(ns), "\n".join(net.node_lines(slot, i, max(indices))) + "\n"))
            node_tc = net.shaping_lines(net.NODE_IFACE, rate, delay)
            if node_tc:
                jobs.append((net.tc_batch_argv(ns), "\n".join(node_tc) + "\n"))
        host_tc = [line for i in indices for line in net.shaping_lines(net.veth_name(slot, i), rate, delay)]
        if host_tc:
            jobs.append((net.tc_batch_argv(), "\n".join(host_tc) + "\n"))
        if self._behind_leader(cluster) and len(indices) > 1:
            rules = firewall.member_ruleset([net.node_address(slot, i) for i in indices])
            jobs += [(firewall.nft_argv(net.netns_name(cluster.name, i)), rules) for i in indices if i != 1]
        for start in range(0, len(jobs), 16):  # bounded parallelism: the machine has few cores
            sysops.run_parallel(jobs[start:start + 16])

    @staticmethod
    def _collect_host_keys(nodes_dir: Path, keygens: dict[int, subprocess.Popen], count: int) -> dict[int, list[str]]:
        keys = {}
        for i, proc in keygens.items():
            _, err = proc.communicate(timeout=60)
            name = node_name(i, count)
            if proc.returncode != 0:
                raise ProviderError(f"ssh-keygen failed for {name}: {err.decode(errors='replace').strip()}")
            pub = (nodes_dir / name / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()
            keys[i] = [f"{pub[0]} {pub[1]}"]
        return keys

    @staticmethod
    def _node(slot: int, i: int, count: int, slots: int | None, host_keys: list[str], nodes_dir: Path) -> Node:
        address = net.node_address(slot, i)
        name = node_name(i, count)
        role = SERVER if i > count else LEADER if i == 1 else MEMBER
        return Node(name=name, index=i, address=address, role=role,
                    slots=0 if role == SERVER else slots or 1, ssh_host=address, ssh_port=22, state="running",
                    instance_id=None, host_keys=host_keys, extra={"log": str(nodes_dir / name / "node.log")})

    def _start_node(self, cluster: ClusterRecord, index: int) -> int:
        """Launch node ``index`` (its PID 1 and sshd) in a new session; return the launcher pid."""
        node_dir = Path(cluster.provider_state["nodes_dir"]) / node_name(index, cluster.provider_state["count"])
        argv = net.node_start_argv(net.netns_name(cluster.name, index), sys.executable,
                                   INIT_SCRIPT, node_dir / "init.json")
        with open(node_dir / "node.log", "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, env=net.node_environment(os.environ))
        _LAUNCHED[proc.pid] = proc
        return proc.pid

    # ---- waiting and querying -------------------------------------------------------

    def wait_instances(self, cluster: ClusterRecord, timeout: float = 600.0) -> list[Node]:
        """Until every node's sshd accepts TCP; a node's sshd starts in well under a second,
        so waiting is capped at WAIT_LIMIT whatever a cloud-minded caller allows."""
        timeout = min(timeout, self.WAIT_LIMIT)
        started = time.monotonic()
        behind = [n for n in cluster.nodes if self._behind_leader(cluster) and n.role != LEADER]
        pending = {n.name: n for n in cluster.nodes if n not in behind}
        pids = cluster.provider_state.get("pids", {})
        deadline = time.monotonic() + timeout
        while pending:
            for name, node in list(pending.items()):
                if _accepts(node.address, node.ssh_port):
                    del pending[name]
            if not pending:
                break
            _reap_launched()
            dead = [n for n in pending if n in pids and not sysops.alive(pids[n])]
            if dead or time.monotonic() > deadline:
                name = (dead or sorted(pending, key=lambda x: pending[x].index))[0]
                node = pending[name]
                what = "stopped" if dead else f"did not accept SSH within {timeout:.0f}s"
                log = Path(cluster.provider_state["nodes_dir"]) / name / "node.log"
                raise ProviderError(f"{name} ({node.address}:22) {what}",
                                    hint=f"its log {log} ends: {sysops.log_tail(log)}")
            time.sleep(0.02)
        firewall.wait_members(cluster, behind, max(1.0, timeout - (time.monotonic() - started)))
        for node in cluster.nodes:
            node.state = "running"
        return cluster.nodes

    def query_instances(self, cluster: ClusterRecord) -> list[Node]:
        names = {n.name: net.netns_name(cluster.name, n.index) for n in cluster.nodes}
        pids = sysops.pids_in_netns(ns for ns in names.values() if sysops.netns_exists(ns))
        out = []
        for node in cluster.nodes:
            ns = names[node.name]
            if ns not in pids:
                node_state = "terminated"
            elif any(sysops.comm(p) == "sshd" for p in pids[ns]):
                node_state = "running"
            else:
                node_state = "stopped"
            out.append(dataclasses.replace(node, state=node_state))
        return out

    # ---- stop / start / terminate ---------------------------------------------------

    def stop_instances(self, cluster: ClusterRecord) -> None:
        namespaces = [net.netns_name(cluster.name, n.index) for n in cluster.nodes]
        pids = sysops.pids_in_netns(namespaces)
        sysops.kill_all([p for ps in pids.values() for p in ps], reap=_reap_launched)
        for node in cluster.nodes:
            node.state = "stopped"

    def start_instances(self, cluster: ClusterRecord) -> list[Node]:
        missing = [n.name for n in cluster.nodes
                   if not sysops.netns_exists(net.netns_name(cluster.name, n.index))]
        if missing:
            raise ProviderError(f"{missing[0]} of cluster {cluster.name!r} no longer exists on this machine",
                                hint="bring the cluster down and up again")
        self.stop_instances(cluster)  # nothing half-running stays
        nodes_dir = Path(cluster.provider_state["nodes_dir"])
        pids = cluster.provider_state.setdefault("pids", {})
        for node in cluster.nodes:
            tmp = nodes_dir / node.name / "tmp"  # a rebooted machine starts with an empty /tmp
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            os.chmod(tmp, 0o1777)
            pids[node.name] = self._start_node(cluster, node.index)
        return self.wait_instances(cluster, timeout=60.0)

    def terminate_instances(self, cluster: ClusterRecord) -> list[str]:
        return teardown(cluster, reap=_reap_launched)

    def autostop_record(self, cluster: ClusterRecord) -> dict | None:
        """What the leader's watcher wrote when it powered the cluster off (its home is on this disk)."""
        nodes_dir = cluster.provider_state.get("nodes_dir")
        if nodes_dir is None:
            return None
        leader = next((n.name for n in cluster.nodes if n.is_leader), "node-1")
        try:
            return json.loads((Path(nodes_dir) / leader / "home" / ".clustertool" / "autostop" /
                               "poweroff.json").read_text())
        except (OSError, ValueError, TypeError):
            return None


def node_name(index: int, count: int) -> str:
    """node-1..node-<count> for workers, then server-1, server-2 ... for the indices past them."""
    return f"node-{index}" if index <= count else f"server-{index - count}"


def _servers(cluster: ClusterRecord) -> int:
    value = cluster.options.get("reduction_servers") or 0
    if not isinstance(value, int) or value < 0:
        raise UsageError(f"option reduction_servers: expected 0 or a positive integer, got {value!r}")
    return value


def _seed_etc_ssh(etc_ssh: Path, host_etc: Path = Path("/etc/ssh")) -> None:
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


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


def _host_software() -> list[str]:
    """Where this clustertool and its Python live on the host (nodes share the host's software)."""
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding the clustertool package
    return net.shared_software([sys.prefix, sys.base_prefix, package_root])
