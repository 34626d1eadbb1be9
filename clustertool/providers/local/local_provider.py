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
import sys
import time
from pathlib import Path
from typing import ClassVar

from clustertool.core import state
from clustertool.core.errors import MissingPrerequisite, ProviderError, UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node, Reporter, silent
from clustertool.providers.base import (
    OptionSpec,
    Provider,
    ProvisionRequest,
    RankEnvironment,
    SlurmPlacement,
    Sweep,
    SweepRemoved,
    SweepRequest,
)
from clustertool.providers.local import firewall, localfs, net, nodes, strays, swap, sysops, userenv
from clustertool.providers.local.removal import teardown
from clustertool.remote import access

_TOOLS = (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"),
          ("ssh-keygen", "openssh-client"), (net.SSHD, "openssh-server"))



def _which(tool: str) -> str | None:
    if tool.startswith("/"):
        return tool if os.access(tool, os.X_OK) else None
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(tool, path=path)


def _not_negative(value: int) -> None:
    if value < 0:
        raise ValueError(f"expected 0 or more, got {value}")


ACCESS_HELP = ("Who takes SSH from this machine: 'leader' (members only through the leader, with ProxyJump) "
               "or 'all' (default: leader on aws, all on local).")


class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    default_user: ClassVar[str] = "root"
    owns_machines: ClassVar[bool] = True
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "link_rate": OptionSpec(str, None, "egress rate at each end of every node's link, e.g. 200mbit (tc tbf)",
                                check=net.rate_bits),
        "link_delay": OptionSpec(str, None, "delay added at each end of every node's link, e.g. 5ms (tc netem); "
                                 "node to node one-way latency is twice this", check=net.delay_seconds),
        "access": OptionSpec(str, "all", ACCESS_HELP, ("leader", "all")),
        "jump": OptionSpec(str, None, "Your own bastion, USER@HOST[:PORT]: the leader (with --access all, every "
                                      "node) is reached through it (its host key must be in ~/.ssh/known_hosts)."),
        "reduction_servers": OptionSpec(int, 0, "K more nodes (server-1..server-K, role server) on the same bridge "
                                        "and links, for the plugin's reduction servers; not ranks",
                                        check=_not_negative),
    }

    WAIT_LIMIT: ClassVar[float] = 60.0
    POWEROFF: ClassVar[str | None] = net.NODE_POWEROFF  # what the autostop watcher runs to power a node off
    REBOOT = "restart"  # a node is its sshd: stop and start it again
    SHARED_FS_KINDS = ("local",)  # the leader's folder over sshfs (providers/local/localfs.py)

    @classmethod
    def hourly_price(cls, node_type: str, nodes: int, spot: bool) -> float | None:
        return 0.0  # namespaces on this machine

    def rank_environment(self, cluster: ClusterRecord) -> RankEnvironment:
        """The user's own environment (this machine's PATH, its virtualenv first): the nodes share its files."""
        return userenv.user_environment(os.environ, sys.prefix, sys.base_prefix)

    def link_rate(self, cluster: ClusterRecord) -> int | None:
        """``--link-rate``: every node's link is shaped to it at both ends (tc tbf)."""
        rate = cluster.options.get("link_rate")
        try:
            return net.rate_bits(str(rate)) if rate else None
        except ValueError:
            return None

    def slurm_placement(self, cluster: ClusterRecord) -> SlurmPlacement:
        """A local node shares this machine's /etc, /run and /var: Slurm lives under the node's home (its own),
        its daemons come back from the node's boot hook; each node gets one stand-in GPU per slot (there are no
        real ones here); no cgroup filesystem inside a node (``ip netns exec`` remounts /sys)."""
        slots = max((n.slots for n in cluster.nodes if not n.is_server), default=1)
        return SlurmPlacement(private=True, boot_hook=f"{net.NODE_BOOT_DIR}/50-slurm.sh", standin_gpus=slots,
                              cgroups=False, slurm_user="root", probe_timeout=60.0,
                              release="this machine's Slurm (Debian's slurmd, slurmctld, slurm-client, munge)")

    def sweep(self, request: SweepRequest) -> Sweep:
        """Bridges (with their namespaces and sshd) whose state is gone (strays.py)."""
        return strays.sweep(request)

    def remove_swept(self, swept: Sweep, report: Reporter = silent) -> SweepRemoved:
        return strays.remove(swept, report)

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
        servers = nodes.servers_of(request.cluster)
        if not 1 <= request.count + servers <= net.MAX_NODES:
            raise UsageError(f"the local provider makes 1 to {net.MAX_NODES} nodes (servers included), "
                             f"not {request.count + servers}")
        rate, delay = nodes.link_options(request.cluster)
        if request.cluster.options.get("jump"):
            access.parse_jump(request.cluster.options["jump"])
        if nodes.behind_leader(request.cluster) and not _which("nft"):
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

    def plan(self, request: ProvisionRequest) -> list[str]:
        name, n = request.cluster.name, request.count
        rate, delay = nodes.link_options(request.cluster)
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
              if (k := nodes.servers_of(request.cluster)) else []),
            f"route: unreachable {net.NET_RANGE} while any local cluster exists",
        ]
        if nodes.behind_leader(request.cluster):
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
        slot = nodes.allocate(request)
        indices = list(range(1, request.count + nodes.servers_of(cluster) + 1))
        ps["count"] = request.count
        ps["servers"] = nodes.servers_of(cluster)
        ps["netns"] = [net.netns_name(cluster.name, i) for i in indices]
        ps["veths"] = [net.veth_name(slot, i) for i in indices]
        request.save()
        keygens = nodes.write_node_files(request, slot, indices)
        nodes.make_network(cluster, slot, indices)
        host_keys = nodes.collect_host_keys(nodes_dir, keygens, request.count)
        cluster.nodes = [nodes.make_node(slot, i, request.count, request.slots, host_keys[i], nodes_dir)
                         for i in indices]
        request.save()
        ps["pids"] = {}
        for node in cluster.nodes:
            ps["pids"][node.name] = nodes.start_node(cluster, node.index)
        request.save()
        what = f" and {ps['servers']} server(s)" if ps["servers"] else ""
        request.report(f"started {request.count} local node(s){what} on bridge {net.bridge_name(slot)}")
        return cluster.nodes

    def shared_fs(self, request: ProvisionRequest) -> list[dict]:
        return localfs.make(request)

    # ---- waiting and querying -------------------------------------------------------

    def wait_instances(self, cluster: ClusterRecord, timeout: float = 600.0) -> list[Node]:
        """Until every node's sshd accepts TCP; a node's sshd starts in well under a second,
        so waiting is capped at WAIT_LIMIT whatever a cloud-minded caller allows."""
        timeout = min(timeout, self.WAIT_LIMIT)
        started = time.monotonic()
        behind = [n for n in cluster.nodes if nodes.behind_leader(cluster) and n.role != LEADER]
        pending = {n.name: n for n in cluster.nodes if n not in behind}
        pids = cluster.provider_state.get("pids", {})
        deadline = time.monotonic() + timeout
        while pending:
            for name, node in list(pending.items()):
                if sysops.accepts(node.address, node.ssh_port):
                    del pending[name]
            if not pending:
                break
            nodes.reap_launched()
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
        sysops.kill_all([p for ps in pids.values() for p in ps], reap=nodes.reap_launched)
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
            pids[node.name] = nodes.start_node(cluster, node.index)
        return self.wait_instances(cluster, timeout=60.0)

    def replace_node(self, cluster: ClusterRecord, node: str, keep_old: bool = False) -> Node:
        """A new namespace, sshd (new host key) and disk for ``node``; the old node's are gone (swap.py)."""
        return swap.replace_node(cluster, node, keep_old, report=self.report, save=lambda: state.save(cluster))

    def terminate_instances(self, cluster: ClusterRecord) -> list[str]:
        return teardown(cluster, reap=nodes.reap_launched)

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
