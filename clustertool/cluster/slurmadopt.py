"""Adopt a cluster that runs Slurm already (`up --provider static --slurm-login HOST`).

The static provider adopts the login node alone (node-1, the leader: where sbatch, squeue and the job
waiters run); once it is wired, its Slurm names the rest: ``sinfo`` and ``scontrol show node`` give every
node's name, address and GPUs, and each becomes node-2, node-3 ... (its Slurm name kept in the record),
reached over SSH like any adopted machine.  Nothing here writes Slurm's config or touches its daemons: the
site's Slurm is read, and jobs go through it as the user.
"""

from __future__ import annotations

import os
import re

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset, state
from clustertool.core.errors import UsageError
from clustertool.core.model import MEMBER, ClusterRecord, Node
from clustertool.remote.group import run_on_node
from clustertool.slurm import SlurmError, bringup, slurmcmd, slurmtext
from clustertool.slurm.layout import DEFAULT_CONF, SLURM_CONF, Layout, system_layout
from clustertool.slurm.slurminfo import SlurmInfo

_GPUS = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")
_AUTH = re.compile(r"^AuthInfo\s*=\s*(.*)$", re.M)


def adopting(cluster: ClusterRecord) -> bool:
    return bool(cluster.options.get("slurm_login"))


def layout_of(options: dict) -> Layout:
    """The site's layout: Slurm's default config path, or the one --slurm-conf names (clients get SLURM_CONF)."""
    conf = str(options.get("slurm_conf") or DEFAULT_CONF)
    if os.path.basename(conf) != SLURM_CONF or not conf.startswith("/"):
        raise UsageError(f"--slurm-conf {conf}: give the absolute path of a file named {SLURM_CONF}")
    return Layout(**{**system_layout().__dict__, "conf_dir": os.path.dirname(conf)})


def gpus_of(gres: str) -> int:
    """``gpu:8``, ``gpu:a100:8(S:0-1)``, ``gpu:4,shard:8`` -> 8, 8, 4 (0: no GPU)."""
    return sum(int(m.group(1)) for m in _GPUS.finditer(gres or ""))


def _slurm(session: ClusterSession, layout: Layout, argv: list[str], what: str) -> str:
    result = bringup.run_slurm(session, session.record.leader, layout, argv)
    if not result.ok:
        raise SlurmError(f"{what} failed on the login node {session.record.leader.reach_host}: {result.reason}",
                         hint="is Slurm's client installed there, and its config found (--slurm-conf PATH)?")
    return result.stdout


def munge_socket(config: str) -> str | None:
    """``scontrol show config``'s ``AuthInfo = socket=/path,ttl=...``: the site's munged socket (None: the default)."""
    found = _AUTH.search(config)
    for item in (found.group(1).split(",") if found else []):
        key, _, value = item.strip().partition("=")
        if key == "socket" and value.startswith("/"):
            return value
    return None


def discover(session: ClusterSession, layout: Layout) -> tuple[list[slurmtext.NodeInfo], str, str]:
    """Every node of the site's Slurm (scontrol's view: address, GRES), its default partition, its release."""
    listed = slurmtext.sinfo_nodes(_slurm(session, layout, slurmcmd.sinfo_nodes_argv(), "sinfo"))
    if not listed:
        raise SlurmError("sinfo lists no node on the login node's Slurm")
    default = next((n.partition for n in listed if n.default_partition), listed[0].partition)
    shown = {i.name: i for i in map(slurmtext.node_info,
                                    slurmtext.records(_slurm(session, layout, slurmcmd.show_argv("node"),
                                                             "scontrol show node")))}
    names = sorted({n.name for n in listed}, key=nodeset.natural_key)
    release = slurmtext.release_text(slurmtext.version(_slurm(session, layout, ["sinfo", "-V"], "sinfo -V")))
    return [shown.get(name) or slurmtext.NodeInfo(name, "", "", "", name, "", "") for name in names], default, release


def adopt(session: ClusterSession, slots: int | None = None) -> SlurmInfo:
    """The login node's Slurm nodes into the record (node-2 ...), not yet wired; returns the Slurm record."""
    cluster = session.record
    layout = layout_of(cluster.options)
    socket = munge_socket(_slurm(session, layout, ["scontrol", "show", "config"], "scontrol show config"))
    if socket:  # doctor's munge check asks the site's own munged
        layout = Layout(**{**layout.__dict__, "munge_socket": socket})
    found, partition, release = discover(session, layout)
    login = cluster.leader
    own = run_on_node(session, login, "hostname -s; hostname -I 2>/dev/null || true", timeout=20).stdout.split()
    names: dict[str, str] = {}
    computes: list[str] = []
    for node_info in found:
        address = node_info.address or node_info.name
        if address in {login.address, login.reach_host} or node_info.name in own[:1]:
            names[login.name] = node_info.name  # the login node computes too
            computes.append(login.name)
            login.slots = slots or gpus_of(node_info.gres) or login.slots
            continue
        index = len(cluster.nodes) + 1
        node = Node(f"node-{index}", index, address, role=MEMBER, slots=slots or gpus_of(node_info.gres) or 1,
                    ssh_host=address, ssh_port=login.ssh_port, extra={"adopted": True, "slurm_name": node_info.name})
        cluster.nodes.append(node)
        cluster.provider_state.setdefault("adopted", []).append(f"{address}:{login.ssh_port}")
        names[node.name] = node_info.name
        computes.append(node.name)
    adopted = SlurmInfo(layout, controller=login.name, nodes=tuple(computes), partition=partition, release=release,
                        made=False, leader_compute=login.name in computes,
                        gpus=max((gpus_of(i.gres) for i in found), default=0),
                        names={k: v for k, v in names.items() if k != v})
    cluster.scheduler = adopted.to_dict()
    state.save(cluster)
    session.report(f"slurm {release}: adopted {len(found)} node(s) {nodeset.fold([i.name for i in found])} of "
                   f"partition {partition} through {login.reach_host}; its config and daemons stay as they are")
    return adopted
