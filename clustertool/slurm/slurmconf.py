"""slurm.conf, gres.conf and cgroup.conf of a cluster, written from its record and its nodes' sizes.

Pure: ``settings_for`` turns a cluster record plus what each node's ``slurmd -C`` said (and how
many GPUs it has) into ``SlurmSettings``; the ``*_text`` functions turn those into the files every
node holds.  Rules Slurm imposes and that are kept here:

- node names in slurm.conf and gres.conf are hostlists whose ranges are numeric (``node-[1-4]``),
  and a ``NodeAddr`` list follows the names in the order the hostlist expands;
- one partition holds every compute node (the workers; the leader too unless it does not compute);
  reduction servers are never Slurm nodes;
- a node's configured size must not exceed what its slurmd finds, or Slurm drains it ("Low
  RealMemory"): nodes of one line take the smallest memory among them;
- a local node has no cgroup filesystem (``ip netns exec`` mounts a fresh /sys without
  /sys/fs/cgroup): Slurm's own process tracking then, and ``CgroupPlugin=cgroup/v1`` so that
  slurmd 22.05 starts at all (its default, autodetect, fails: "No filesystem mounted on
  /sys/fs/cgroup").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.core import nodeset
from clustertool.core.model import ClusterRecord, Node
from clustertool.slurm import SlurmError
from clustertool.slurm.layout import Layout

PARTITION = "workers"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
GPU_DEVICE = "/dev/nvidia"  # GPU k is /dev/nvidia<k> (NVIDIA's driver; the local stand-ins use the same names)
DEFAULT_MUNGE_SOCKET = "/run/munge/munge.socket.2"


@dataclass(frozen=True)
class NodeSize:
    """What ``slurmd -C`` reports of a machine."""

    cpus: int
    boards: int
    sockets_per_board: int
    cores_per_socket: int
    threads_per_core: int
    real_memory: int  # MiB

    def words(self, memory: int | None = None) -> str:
        return (f"CPUs={self.cpus} Boards={self.boards} SocketsPerBoard={self.sockets_per_board} "
                f"CoresPerSocket={self.cores_per_socket} ThreadsPerCore={self.threads_per_core} "
                f"RealMemory={self.real_memory if memory is None else memory}")

    def shape(self) -> tuple[int, int, int, int, int]:
        """Everything but memory (which differs by a few MiB between identical machines)."""
        return (self.cpus, self.boards, self.sockets_per_board, self.cores_per_socket, self.threads_per_core)


@dataclass(frozen=True)
class ComputeNode:
    name: str
    address: str
    size: NodeSize
    gpus: int = 0


@dataclass(frozen=True)
class Timers:
    """Slurm's timers in seconds (slurm.conf's defaults; a test shortens them to see a node's death soon)."""

    slurmd_timeout: int = 300     # a node not heard from this long is DOWN (its jobs requeue)
    slurmctld_timeout: int = 120
    message_timeout: int = 10
    kill_wait: int = 30           # SIGTERM to SIGKILL when a job ends or is cancelled
    min_job_age: int = 300        # how long a finished job stays visible to squeue and scontrol
    # an allocation whose srun no longer answers is ended after this long (Slurm's default, 0, never
    # ends it): after a node was killed rather than shut down, slurmctld recovers its last saved state,
    # where a step that had finished may still run, holding its nodes
    inactive_limit: int = 60


@dataclass(frozen=True)
class SlurmSettings:
    cluster: str
    controller: str            # the leader's node name
    controller_address: str
    nodes: tuple[ComputeNode, ...]
    layout: Layout
    partition: str = PARTITION
    cgroups: bool = False      # real cgroups (proctrack/cgroup, task/cgroup): machines of their own
    slurm_user: str = "root"   # who slurmctld runs as ("slurm" where the packages made that user)
    timers: Timers = field(default_factory=Timers)
    release: str = ""          # what every node's slurmd -V said (set by bringup.setup)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def hostlist(self) -> str:
        return nodeset.fold(self.node_names)


def compute_nodes(record: ClusterRecord, leader_compute: bool = True) -> list[Node]:
    """The nodes that run jobs: every worker (reduction servers never), the leader unless it does not compute."""
    nodes = [n for n in record.ordered_nodes() if not n.is_server and (leader_compute or not n.is_leader)]
    if not nodes:
        raise SlurmError(f"cluster {record.name} has no node to run jobs on",
                         hint="a cluster of one node must let its leader compute")
    return nodes


def settings_for(record: ClusterRecord, sizes: dict[str, tuple[NodeSize, int]], layout: Layout, *,
                 leader_compute: bool = True, cgroups: bool = False, slurm_user: str = "root",
                 timers: Timers | None = None) -> SlurmSettings:
    """The cluster's Slurm settings; ``sizes``: node name -> (its ``slurmd -C`` size, its GPU count)."""
    compute = compute_nodes(record, leader_compute)
    missing = [n.name for n in compute if n.name not in sizes]
    if missing:
        raise SlurmError(f"no size known for {nodeset.fold(missing)} (slurmd -C did not answer there)")
    nodes = tuple(ComputeNode(n.name, n.address, *sizes[n.name]) for n in compute)
    leader = record.leader
    return SlurmSettings(cluster=record.name, controller=leader.name, controller_address=leader.address,
                         nodes=nodes, layout=layout, cgroups=cgroups, slurm_user=slurm_user,
                         timers=timers or Timers())


def node_groups(nodes: tuple[ComputeNode, ...]) -> list[list[ComputeNode]]:
    """Nodes of one shape and GPU count, in hostlist order (one NodeName line each)."""
    groups: dict[tuple, list[ComputeNode]] = {}
    for node in nodes:
        groups.setdefault((node.size.shape(), node.gpus), []).append(node)
    ordered = [sorted(g, key=lambda n: nodeset.natural_key(n.name)) for g in groups.values()]
    return sorted(ordered, key=lambda g: nodeset.natural_key(g[0].name))


def _hostlist_order(group: list[ComputeNode]) -> tuple[str, list[ComputeNode]]:
    """The group's hostlist and its nodes in the order Slurm expands it (NodeAddr must follow it)."""
    hostlist = nodeset.fold([n.name for n in group])
    by_name = {n.name: n for n in group}
    return hostlist, [by_name[name] for name in nodeset.expand(hostlist)]


def node_line(group: list[ComputeNode]) -> str:
    hostlist, ordered = _hostlist_order(group)
    memory = min(n.size.real_memory for n in group)
    gres = f" Gres=gpu:{group[0].gpus}" if group[0].gpus else ""
    addresses = ",".join(n.address for n in ordered)
    return f"NodeName={hostlist} NodeAddr={addresses} {group[0].size.words(memory)}{gres} State=UNKNOWN"


def _plugins(s: SlurmSettings) -> list[str]:
    if s.cgroups:
        return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity",
                "JobAcctGatherType=jobacct_gather/cgroup"]
    return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/linux"]


def _paths(s: SlurmSettings) -> list[str]:
    lay = s.layout
    lines = [f"StateSaveLocation={lay.state_dir}", f"SlurmdSpoolDir={lay.spool_dir}",
             f"SlurmctldPidFile={lay.pid_file('slurmctld')}", f"SlurmdPidFile={lay.pid_file('slurmd')}",
             f"SlurmctldLogFile={lay.log_file('slurmctld')}", f"SlurmdLogFile={lay.log_file('slurmd')}",
             "JobCompType=jobcomp/filetxt", f"JobCompLoc={lay.log_dir}/jobcomp.log"]
    if lay.munge_socket != DEFAULT_MUNGE_SOCKET:
        lines.insert(0, f"AuthInfo=socket={lay.munge_socket}")
    return lines


def _timers(t: Timers) -> list[str]:
    return [f"SlurmdTimeout={t.slurmd_timeout}", f"SlurmctldTimeout={t.slurmctld_timeout}",
            f"MessageTimeout={t.message_timeout}", f"KillWait={t.kill_wait}", f"MinJobAge={t.min_job_age}",
            f"InactiveLimit={t.inactive_limit}"]


def slurm_conf_text(s: SlurmSettings) -> str:
    """slurm.conf: the same file on every node of the cluster."""
    lines = [
        f"# slurm.conf of cluster {s.cluster}, written by clustertool; every node holds the same file",
        f"ClusterName={s.cluster}",
        f"SlurmctldHost={s.controller}({s.controller_address})",
        f"SlurmctldPort={SLURMCTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        f"SlurmUser={s.slurm_user}", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        *_paths(s), *_plugins(s),
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "AccountingStorageType=accounting_storage/none", "GresTypes=gpu", "MpiDefault=none",
        "ReturnToService=2",  # a node that was DOWN comes back when its slurmd registers with a valid config
        "KillOnBadExit=1",    # one task that fails ends its whole step (fail-fast)
        *_timers(s.timers),
        *[node_line(g) for g in node_groups(s.nodes)],
        f"PartitionName={s.partition} Nodes={s.hostlist} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gpu_files(count: int) -> str:
    """gres.conf's File= for GPUs 0..count-1: /dev/nvidia0, or /dev/nvidia[0-7]."""
    if count < 1:
        raise ValueError("no GPUs")
    return f"{GPU_DEVICE}0" if count == 1 else f"{GPU_DEVICE}[0-{count - 1}]"


def gres_conf_text(s: SlurmSettings) -> str:
    """gres.conf: one ``Name=gpu File=/dev/nvidia[0-K]`` line per group of nodes with GPUs."""
    lines = [f"# gres.conf of cluster {s.cluster}, written by clustertool"]
    for group in node_groups(s.nodes):
        if group[0].gpus:
            lines.append(f"NodeName={_hostlist_order(group)[0]} Name=gpu File={gpu_files(group[0].gpus)}")
    return "\n".join(lines) + "\n"


def cgroup_conf_text(s: SlurmSettings) -> str:
    """cgroup.conf: with real cgroups, cores and GPUs are fenced per job; without (a local node), the
    cgroup/v1 plugin, which loads without a cgroup filesystem and is never used."""
    lines = [f"# cgroup.conf of cluster {s.cluster}, written by clustertool"]
    if s.cgroups:
        lines += ["CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainDevices=yes"]
    else:
        lines += ["CgroupPlugin=cgroup/v1"]
    return "\n".join(lines) + "\n"


def conf_files(s: SlurmSettings) -> dict[str, str]:
    """File name (in the layout's conf_dir) -> text."""
    return {"slurm.conf": slurm_conf_text(s), "gres.conf": gres_conf_text(s), "cgroup.conf": cgroup_conf_text(s)}
