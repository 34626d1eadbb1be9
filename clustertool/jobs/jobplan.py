"""A job, planned before anything runs: a pure function turns the user's options into an
immutable plan (mpirun's argv, the hostfile, the environment, the working directory).

The user's ``MpiOptions`` are never written to: the plan holds its own copy with what it
derived (the job id, the cluster's subnet, root or not, where the hostfile and the rank output
live).  What only the nodes can say (the leader's home, the reduction servers' ports) comes in
through :meth:`JobPlan.with_facts`, which returns a new plan; a dry run shows the plan as made,
``$HOME`` and all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from clustertool.core.errors import UsageError
from clustertool.core.jobpaths import JOBS_DIR, RANK_HOST_ENV
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs import launchers
from clustertool.jobs.launchers import LaunchSpec
from clustertool.jobs.mpirun import (
    MpiOptions,
    build_argv,
    cluster_subnet,
    env_items,
    job_hostfile,
    placement,
    split_command,
)
from clustertool.jobs.scripts import rank_host

HOME = "$HOME"  # the leader's home until preflight says it
FAN = "fan.py"  # nodeprogs/fan.py, in the job's folder on the leader: what starts the node launchers
PORT = "PORT"  # MASTER_PORT until preflight finds a free one on the leader (a dry run shows this)


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    options: MpiOptions  # the plan's own copy, with what it derived
    nodes: tuple[Node, ...]  # the rank nodes, leader first (the hostfile order)
    servers: tuple[Node, ...] = ()  # reduction servers the job starts reducers on (never ranks)
    sync: tuple[str, str] | None = None  # --sync: (the local folder, its path on the nodes)
    home: str = HOME
    spec: LaunchSpec = LaunchSpec()  # what starts the ranks (jobs/launchers.py)

    @property
    def launcher(self) -> str:
        return self.spec.kind

    @property
    def argv(self) -> list[str]:
        if self.spec.node_launcher:  # one job agent per node that has ranks, started by the leader's fan-out
            return self.fan_argv()
        return build_argv([(n.address, n.slots) for n in self.nodes], self.options)

    def fan_argv(self) -> list[str]:
        """nodeprogs/fan.py in the job's folder on the leader: every node's agent at once (the leader's here,
        the others' over ssh), the job stopped when one fails; mpirun's -H, -wdir and -x, as mpirun's argv."""
        if not self.options.command:
            raise UsageError("no command given", hint="clustertool run -- torchrun train.py")
        argv = [_job_path(self.home, self.job_id, FAN), "-H", ",".join(n.address for n, _ in self.layout)]
        if self.options.workdir:
            argv += ["-wdir", self.options.workdir]
        for item in env_items(self.options):
            argv += ["-x", item]
        if not any(item.split("=", 1)[0] == "MASTER_PORT" for item in self.options.env):  # not the user's own
            argv += ["-free-port", "MASTER_PORT"]
        return argv

    @property
    def program(self) -> str:
        """What every node runs first: the launcher (torchrun, python3 -m ..., accelerate ...), or the program."""
        if self.spec.kind == "process" or not self.spec.node_launcher:
            return self.spec.program[0]
        return self.spec.prefix[0]

    @property
    def rank_path(self) -> str | None:
        """The PATH the ranks get from this machine (the provider's, or a -x PATH=...); None: the nodes' own."""
        found = None
        for item in env_items(self.options):
            if item.split("=", 1)[0] == "PATH":
                found = item.split("=", 1)[1] if "=" in item else None
        return found

    @property
    def layout(self) -> list[tuple[Node, int]]:
        return rank_layout(self.nodes, self.options)

    @property
    def hostfile(self) -> str:
        if self.spec.node_launcher:
            return job_hostfile([(n.address, 1) for n, _ in self.layout])
        return job_hostfile([(n.address, self.options.per_node or n.slots) for n in self.nodes])

    @property
    def np(self) -> int:
        return placement([(n.address, n.slots) for n in self.nodes], self.options)[1]

    def node_commands(self) -> list[tuple[Node, list[str]]]:
        """What each node's agent starts: its launcher's command ({agent}, {port}: filled in there),
        or for ``process`` the program, once per slot."""
        plan = self.agent_plan()
        return [(n, share.get("argv") or list(self.spec.program)) for (n, _), share in zip(self.layout, plan["nodes"])]

    def shown_node_commands(self) -> list[tuple[Node, list[str]]]:
        """:meth:`node_commands` as a dry run shows them: the user's script where the agent's rank runner
        stands, PORT for the port the leader picks, the job's DeepSpeed hostfile by its path."""
        program = launchers.rank_program(self.spec)
        script = {"module": ["-m", program.get("target", "")], "python": [program.get("target", "")]}.get(
            program["mode"], [program.get("target", "")])
        fill = {launchers.PORT: PORT, launchers.DS_HOSTFILE: _job_path(self.home, self.job_id, "ds_hostfile")}
        shown = []
        for node, argv in self.node_commands():
            words: list[str] = []
            for word in argv:
                words += script if word == launchers.AGENT else [fill.get(word, word)]
            shown.append((node, words))
        return shown

    def agent_plan(self, master_addr: str | None = None) -> dict:
        """agent.json: what every node's job agent needs (nodeprogs/jobagent.py).  ``master_addr``: what the
        launchers get as the master's address instead of the first node's (a Slurm job: ``{master_addr}``,
        filled in on the node, whose allocation is known only there)."""
        layout = self.layout
        world = sum(count for _, count in layout)
        rdzv = launchers.Rendezvous(master_addr or self.nodes[0].address, self.job_id, world, len(layout))
        shares, first = [], 0
        for i, (_, count) in enumerate(layout):
            share = launchers.NodeShare(i, count, first)
            entry: dict = {"nprocs": count, "first_rank": first}
            if self.spec.kind != "process":
                entry["argv"] = launchers.node_argv(self.spec, share, rdzv)
            shares.append(entry)
            first += count
        plan: dict[str, Any] = {"launcher": self.spec.kind, "out": self.options.output_dir,
                                "width": len(str(max(world - 1, 0))), "world_size": world,
                                "program": launchers.rank_program(self.spec), "nodes": shares}
        if self.spec.kind == "deepspeed" and master_addr:  # the nodes' addresses: known on the nodes
            plan["hostfile_slots"] = [count for _, count in layout]
        elif self.spec.kind == "deepspeed":
            plan["hostfile"] = job_hostfile([(n.address, count) for n, count in layout])
        if launchers.wants_cpu(self.spec):
            plan["cpu"] = True
        return plan

    def with_facts(self, home: str, server_env: dict[str, str] | None = None,
                   master_port: int | None = None) -> JobPlan:
        """The plan once the leader's home, a free port there and the reducers' addresses are known."""
        rank_env = dict(self.options.rank_env)
        if master_port is not None:
            rank_env["MASTER_PORT"] = str(master_port)
        opts = dataclasses.replace(self.options, hostfile=_job_path(home, self.job_id, "hostfile"),
                                   output_dir=_job_path(home, self.job_id, "out"), rank_env=rank_env,
                                   plugin_env={**self.options.plugin_env, **(server_env or {})})
        return dataclasses.replace(self, options=opts, home=home)


def rank_layout(nodes: tuple[Node, ...], opts: MpiOptions) -> list[tuple[Node, int]]:
    """(node, its number of ranks) for the nodes that get any, as `-map-by slot` fills them in
    hostfile order (with --oversubscribe past the slots, the rest go round the nodes again)."""
    hosts, np = placement([(n.address, n.slots) for n in nodes], opts)
    counts = [min(slots, max(np - sum(s for _, s in hosts[:i]), 0)) for i, (_, slots) in enumerate(hosts)]
    extra, i = np - sum(counts), 0
    while extra > 0:  # oversubscribed: one more rank per node, round and round
        counts[i % len(counts)] += 1
        extra, i = extra - 1, i + 1
    return [(n, c) for n, c in zip(nodes, counts) if c]


def rank_env(nodes: tuple[Node, ...], opts: MpiOptions) -> dict[str, str]:
    """What every rank gets beside its own RANK/LOCAL_RANK (the rank wrapper adds those): where
    rank 0 listens, how many nodes, their addresses (leader first), and where each node's ranks
    start.  Reduction servers are never nodes here."""
    layout = rank_layout(nodes, opts)
    starts, at = [], 0
    for _, count in layout:
        starts.append(str(at))
        at += count
    oversubscribed = at > sum(slots for _, slots in placement([(n.address, n.slots) for n in nodes], opts)[0])
    env = {"MASTER_ADDR": nodes[0].address, "MASTER_PORT": PORT, "NNODES": str(len(layout)),
           RANK_HOST_ENV: rank_host(),
           "CLUSTERTOOL_NUM_NODES": str(len(layout)),
           "CLUSTERTOOL_NODE_IPS": "\n".join(n.address for n, _ in layout)}
    if not oversubscribed:  # contiguous blocks: each node's first rank says which node a rank is on
        env["CLUSTERTOOL_RANK_STARTS"] = " ".join(starts)
    return env


def _job_path(home: str, job_id: str, leaf: str) -> str:
    return f"{home}/{JOBS_DIR}/{job_id}/{leaf}"


def declared_subnet(cluster: ClusterRecord) -> str | None:
    ps = cluster.provider_state
    for key in ("subnet_cidr", "cidr", "subnet"):
        if isinstance(ps.get(key), str) and "/" in ps[key]:
            return ps[key]
    return None


def plan_job(cluster: ClusterRecord, nodes: list[Node], opts: MpiOptions, job_id: str, *,
             sync: tuple[str, str] | None = None, plugin_env: dict[str, str] | None = None,
             servers: list[Node] | None = None, node_env: dict[str, str] | None = None) -> JobPlan:
    """The job on ``nodes`` (rank nodes of ``cluster``); every mistake in the options is a
    UsageError here, before anything reaches a node.  ``node_env``: what the provider hands every rank
    from this machine (PATH, VIRTUAL_ENV on a local cluster); the user's own -x of a name wins."""
    ordered = [n for n in cluster.ordered_nodes() if n in nodes]
    if cluster.leader not in ordered:
        raise UsageError("the selected nodes must include the leader (mpirun runs there)",
                         hint="add the leader to --nodes, or leave --nodes out")
    workdir = opts.workdir
    if sync is not None:
        if workdir is not None and workdir != sync[1]:
            raise UsageError("--sync sets the working directory (the synced folder on the nodes): leave out "
                             "--workdir", hint="--sync-to PATH puts the folder elsewhere on the nodes")
        workdir = sync[1]
    derived = dataclasses.replace(
        opts, command=split_command(opts.command), job_id=job_id, as_root=cluster.user == "root",
        subnet=cluster_subnet([n.address for n in ordered], declared_subnet(cluster)),
        hostfile=_job_path(HOME, job_id, "hostfile"), output_dir=_job_path(HOME, job_id, "out"),
        workdir=workdir, plugin_env=dict(plugin_env or {}), env=list(opts.env), mpi_args=list(opts.mpi_args))
    spec = launchers.parse(derived.command, opts.launcher)
    if spec.per_node is not None:
        if derived.per_node not in (None, spec.per_node):
            raise UsageError(f"--per-node {derived.per_node} and the launcher's {spec.per_node} processes a node "
                             "disagree", hint="give one of them")
        derived = dataclasses.replace(derived, per_node=spec.per_node)
    if spec.node_launcher:
        derived = dataclasses.replace(derived, command=list(spec.program))
    env = rank_env(tuple(ordered), derived)
    given = {item.split("=", 1)[0] for item in derived.env}
    env.update({k: v for k, v in (node_env or {}).items() if k not in given})
    if max(count for _, count in rank_layout(tuple(ordered), derived)) > 1 and not any(
            item.split("=", 1)[0] == "OMP_NUM_THREADS" for item in derived.env):
        # As torchrun does: several ranks a node, each with a thread per core, overload the node (and on
        # a loaded machine gloo then aborted ranks at exit: "terminate called without an active exception")
        env["OMP_NUM_THREADS"] = "1"
    derived = dataclasses.replace(derived, rank_env=env)
    plan = JobPlan(job_id, derived, tuple(ordered), tuple(servers or ()), sync, spec=spec)
    _check_shares(plan)
    plan.argv  # build it once now: a bad option stops here
    return plan


def _check_shares(plan: JobPlan) -> None:
    """Accelerate and DeepSpeed take one number of processes for every node."""
    counts = {count for _, count in plan.layout}
    if plan.spec.kind in ("accelerate", "deepspeed") and len(counts) > 1:
        shown = ", ".join(f"{n.name}: {c}" for n, c in plan.layout)
        raise UsageError(f"{plan.spec.kind} runs the same number of processes on every node, not {shown}",
                         hint="use --per-node N (or an --np that fills whole nodes)")
