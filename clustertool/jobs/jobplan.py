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

from clustertool.core.errors import UsageError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs.mpirun import MpiOptions, build_argv, cluster_subnet, job_hostfile, split_command

HOME = "$HOME"  # the leader's home until preflight says it


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    options: MpiOptions  # the plan's own copy, with what it derived
    nodes: tuple[Node, ...]  # the rank nodes, leader first (the hostfile order)
    servers: tuple[Node, ...] = ()  # reduction servers the job starts reducers on (never ranks)
    sync: tuple[str, str] | None = None  # --sync: (the local folder, its path on the nodes)
    home: str = HOME

    @property
    def argv(self) -> list[str]:
        return build_argv([(n.address, n.slots) for n in self.nodes], self.options)

    @property
    def hostfile(self) -> str:
        return job_hostfile([(n.address, self.options.per_node or n.slots) for n in self.nodes])

    @property
    def np(self) -> int:
        argv = self.argv
        return int(argv[argv.index("-np") + 1])

    def with_facts(self, home: str, server_env: dict[str, str] | None = None) -> JobPlan:
        """The plan once the leader's home (and the reducers' addresses) are known."""
        opts = dataclasses.replace(self.options, hostfile=_job_path(home, self.job_id, "hostfile"),
                                   output_dir=_job_path(home, self.job_id, "out"),
                                   plugin_env={**self.options.plugin_env, **(server_env or {})})
        return dataclasses.replace(self, options=opts, home=home)


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
             servers: list[Node] | None = None) -> JobPlan:
    """The job on ``nodes`` (rank nodes of ``cluster``); every mistake in the options is a
    UsageError here, before anything reaches a node."""
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
    plan = JobPlan(job_id, derived, tuple(ordered), tuple(servers or ()), sync)
    plan.argv  # build it once now: a bad option stops here
    return plan
