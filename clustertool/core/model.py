"""Plain data passed between core modules, providers and the CLI."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from clustertool.core.errors import StateError, UsageError

LEADER = "leader"
MEMBER = "member"
SERVER = "server"  # a reduction server: reached by ssh like any node, but never a rank
REASON_MAX = 200  # characters of a command's last stderr line kept in a node's failure reason
# ClusterRecord.block_end: how long before the machines go running jobs are signalled, and with what
BLOCK_END_WARNING = "30m"  # --block-end-warning's default
BLOCK_END_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT")  # --block-end-signal's choices

Reporter = Callable[[str], None]  # progress lines for the user; the CLI prints them, --json drops them


def silent(message: str) -> None:
    """The Reporter that says nothing (the default of every core function that reports)."""


def jsonable(obj: Any) -> Any:
    """Plain JSON data (dicts, lists, str, numbers) of results: dataclasses, paths, tuples and all."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


@dataclass
class Node:
    """One machine of a cluster.

    ``name`` is the short node name (``node-1`` ...); node-1 is not necessarily the leader,
    ``role`` says.  ``address`` is the private address other nodes and hostfiles use;
    ``ssh_host``/``ssh_port`` is how *this* machine reaches the node (a public address on
    AWS, the same private address for the local provider).
    """

    name: str
    index: int
    address: str
    role: str = MEMBER
    slots: int = 1
    ssh_host: str | None = None
    ssh_port: int = 22
    state: str = "running"
    instance_id: str | None = None
    host_keys: list[str] = field(default_factory=list)  # "ssh-ed25519 AAAA..." lines, no host part
    extra: dict[str, Any] = field(default_factory=dict)
    # `clustertool cordon`: {"reason": str, "since": epoch seconds, "by": "user" | "doctor"}; None (and a
    # record from before cordons): jobs may use the node
    cordon: dict[str, Any] | None = None

    @property
    def is_leader(self) -> bool:
        return self.role == LEADER

    @property
    def cordoned(self) -> bool:
        """Out of the hostfiles and of every job's default nodes until uncordoned (exec and copy still reach it)."""
        return self.cordon is not None

    @property
    def is_server(self) -> bool:
        return self.role == SERVER

    @property
    def reach_host(self) -> str:
        return self.ssh_host or self.address

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Node":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class ClusterState(str, enum.Enum):
    """Where a cluster is in its life (the state file and `status` print the value)."""

    PROVISIONING = "provisioning"  # `up` is making it (or died doing so: `down` removes what it made)
    PROVISIONED = "provisioned"    # up with --no-ssh: machines run, SSH is not wired
    READY = "ready"                # up and wired: commands run on it
    STOPPED = "stopped"            # `stop`: machines off, disks kept
    AUTOSTOPPED = "autostopped"    # its watcher powered it off
    AUTODOWNED = "autodowned"      # its watcher terminated it
    FAILED = "failed"              # `up` failed and its rollback failed too

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# Keys older state files kept in ``options`` (the provider's bag) that are core fields now.
_CORE_FLAGS = ("no_ssh", "terminate_adopted", "autostop")


@dataclass
class ClusterRecord:
    """A cluster as recorded in its state file."""

    name: str
    provider: str
    user: str = "root"
    id: str = ""  # unique per `up`: the name + a random suffix; what teardown and sweeps go by
    nodes: list[Node] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # provider options from spec/flags
    provider_state: dict[str, Any] = field(default_factory=dict)  # what the provider made
    status: ClusterState = ClusterState.PROVISIONING
    no_ssh: bool = False  # up --no-ssh: providers wait for "running", not for SSH; nothing is wired
    terminate_adopted: bool = False  # down --terminate-adopted: adopted machines are terminated too
    keep_shared_fs: bool = False  # down --keep-shared-fs: the shared filesystems `up` made stay
    autostop: dict[str, Any] | None = None  # the autostop setting (cluster.autostop.Setting.to_dict())
    block_end: dict[str, Any] | None = None  # when the machines go; the leader warns jobs (cluster/blockend.py)
    monitoring: dict[str, Any] | None = None  # while Prometheus runs on it: cluster.monitoring.MonitoringRequest's dict
    created: float = 0.0
    ssh_key: str | None = None  # path of the initial identity when not the cluster key (static)
    hostfile_path: str | None = None
    jump_keys: list[str] = field(default_factory=list)  # pinned host keys of the user's --jump bastion
    # the cluster's scheduler: None (clustertool's own runs), or Slurm's record (slurm/slurminfo.py: made by
    # `up --scheduler slurm`, or adopted with --slurm-login)
    scheduler: dict[str, Any] | None = None

    @property
    def leader(self) -> Node:
        for node in self.nodes:
            if node.is_leader:
                return node
        if not self.nodes:
            raise StateError(f"cluster {self.name!r} has no nodes")
        return self.nodes[0]

    @property
    def members(self) -> list[Node]:
        """The workers other than the leader (servers are not members)."""
        return [n for n in self.nodes if not n.is_leader and not n.is_server]

    @property
    def workers(self) -> list[Node]:
        """The nodes that run ranks, leader first (what hostfiles and jobs use)."""
        return [n for n in self.ordered_nodes() if not n.is_server]

    @property
    def servers(self) -> list[Node]:
        """The reduction servers, by index: reached by ssh, never ranks."""
        return [n for n in self.ordered_nodes() if n.is_server]

    @property
    def schedulable(self) -> list[Node]:
        """The workers not cordoned, leader first: what the hostfiles and every job's default nodes are."""
        return [n for n in self.workers if not n.cordoned]

    @property
    def schedulable_servers(self) -> list[Node]:
        """The reduction servers not cordoned: those a `run --plugin` job starts its reducers on."""
        return [n for n in self.servers if not n.cordoned]

    @property
    def cordoned(self) -> list[Node]:
        return [n for n in self.ordered_nodes() if n.cordoned]

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes if not n.is_server)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise UsageError(f"cluster {self.name!r} has no node {name!r}",
                         hint="see `clustertool status` for node names")

    def ordered_nodes(self) -> list[Node]:
        """Leader first, then members by index (the hostfile order), then servers."""
        return sorted(self.nodes, key=lambda n: (n.is_server, not n.is_leader, n.index))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ClusterRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["nodes"] = [Node.from_dict(n) for n in data.get("nodes", [])]
        options = dict(values.get("options") or {})
        for key in _CORE_FLAGS:  # a state file from before they were fields
            if key in options:
                values.setdefault(key, options.pop(key))
        values["options"] = options
        values["status"] = ClusterState(values.get("status", ClusterState.PROVISIONING))
        return cls(**values)


@dataclass
class HostResult:
    """The outcome of one command on one node. A failure is a value, not an exception."""

    node: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    error: str | None = None  # unreachable / timed out / ssh failure, in words

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    @property
    def effective_code(self) -> int:
        """Exit code for aggregation: 255 for unreachable or timed out."""
        if self.error is not None or self.exit_code is None:
            return 255
        return self.exit_code

    @property
    def reason(self) -> str:
        """Why this node failed, in words ("" when it did not): the one wording of a node's failure.

        The transport's reason when the command never ran or did not finish (unreachable, host
        key, timed out), else the exit code and the last line the command wrote on stderr.
        """
        if self.error is not None:
            return self.error
        if self.exit_code == 0:
            return ""
        last = next((ln.strip() for ln in reversed(self.stderr.splitlines()) if ln.strip()), "")
        if len(last) > REASON_MAX:
            last = "..." + last[-REASON_MAX:]
        code = "no exit code" if self.exit_code is None else f"exit {self.exit_code}"
        return f"{code}: {last}" if last else code

    def to_dict(self) -> dict[str, Any]:
        """One node's entry of `exec --json`'s "results"."""
        return jsonable(self)


@dataclass
class GroupResult:
    """Results of one command across several nodes, in node order."""

    results: list[HostResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return max((r.effective_code for r in self.results), default=0)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def failed(self) -> list[HostResult]:
        return [r for r in self.results if not r.ok]

    def by_node(self) -> dict[str, HostResult]:
        return {r.node: r for r in self.results}

    def to_dict(self) -> dict[str, Any]:
        """What `clustertool exec --json` prints: the exit code and every node's result."""
        return {"exit_code": self.exit_code, "results": [r.to_dict() for r in self.results]}


@dataclass
class JobRecord:
    """One `clustertool run`: the record kept on the leader (job.json) and in local state."""

    id: str
    cluster: str
    command: list[str]
    argv: list[str] = field(default_factory=list)  # the full mpirun argv
    nodes: list[str] = field(default_factory=list)
    np: int = 0
    name: str | None = None
    leader: str = ""
    workdir: str | None = None
    detached: str = ""  # tmux | setsid: what keeps the job running on the leader
    launcher: str = "mpirun"  # what starts the ranks: mpirun | torchrun | accelerate | deepspeed | process
    started: float = 0.0
    ended: float | None = None
    state: str = "running"  # pending (in Slurm's queue) | running | succeeded | failed | killed | lost
    exit_code: int | None = None
    output_dir: str | None = None  # per-rank output files on each rank's node; None: only the log (older jobs)
    tag_output: bool = True  # show lines as [job,rank]<stream>:text
    servers: list[str] = field(default_factory=list)  # server nodes running this job's reducers (run --plugin)
    servers_lost: list[str] = field(default_factory=list)  # of those, the ones gone before the job ended
    failure: dict[str, Any] | None = None  # a failed job: the rank (or node) that failed first (jobs/failure.py)
    hang_timeout: float | None = None  # run --hang-timeout, in seconds
    hang_action: str = "keep"  # run --hang-action: keep | kill
    hung: dict[str, Any] | None = None  # the supervisor found it hung: {"since", "detected", ...}
    restarts: int = 0  # run --restarts N: start the same command again, up to N times, when it fails
    restart_on_exit_codes: list[int] | None = None  # only these exit codes restart (None: any non-zero)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # {"attempt", "start", "end", "code", "cause"}
    restart_verdict: str | None = None  # why the restart loop stopped (nodeprogs/restarts.py)
    replace_failed: bool = False  # run --replace-failed: a lost node is replaced, then the job restarts
    replace_wait: float | None = None  # run --replace-wait, seconds: how long the leader waits for that
    on_preempt_signal: str | None = None  # the signal ranks get on a spot notice (None: nothing watches)
    block_end_signal: dict[str, Any] | None = None  # the leader signalled it before its capacity block ended
    waiting: dict[str, Any] | None = None  # the leader waits for these nodes' replacement: {"nodes", "until", ...}
    # a job run through Slurm (jobs/slurmrun.py): {"id", "state", "reason", "user", "nodes", "restarts", ...},
    # kept after Slurm forgets the job; its state "pending" is a job waiting in Slurm's queue
    slurm: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.state not in ("running", "pending")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        data = dict(data)
        if data.get("launcher") in ("tmux", "setsid", "pending") and "detached" not in data:
            data["detached"] = data.pop("launcher")  # a record from before launchers: its detacher
        return cls(**{k: v for k, v in data.items() if k in known})
