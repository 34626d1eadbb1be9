"""argv for Slurm's programs, and the fixed output formats clustertool asks them for.

Pure functions returning argv lists (a remote shell gets them through ``shlex.join``).  The
formats name every field explicitly, so the text does not depend on the site's defaults
(``SINFO_FORMAT``, ``SQUEUE_FORMAT`` ...) or on the release; free text (a drain reason, a job
name) is always the last field, so a ``|`` inside it cannot shift the others.  ``slurmtext``
parses what these print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from clustertool.core import nodeset
from clustertool.slurm.layout import Layout

SEP = "|"
# sinfo -N: one line per node (and partition): name, partition, state, GRES, CPUs, memory, reason.
SINFO_NODE_FIELDS = ("%N", "%P", "%T", "%G", "%c", "%m", "%E")
# squeue: id, state, reason (why pending), user, node count, nodes, submit and start time, name.
SQUEUE_FIELDS = ("%i", "%T", "%r", "%u", "%D", "%N", "%V", "%S", "%j")
# sacct -P (where accounting runs, e.g. an adopted cluster): the allocation's line of each job.
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "User", "NNodes", "NodeList", "Start", "End", "JobName")


def with_conf(layout: Layout, argv: Sequence[str]) -> list[str]:
    """``argv`` told where the cluster's slurm.conf is, when it is not at Slurm's default path."""
    return ["env", f"SLURM_CONF={layout.slurm_conf}", *argv] if layout.needs_conf_env else list(argv)


# ---- what runs: nodes and the queue ---------------------------------------------------------------

def sinfo_nodes_argv(nodes: Sequence[str] = ()) -> list[str]:
    argv = ["sinfo", "--noheader", "--Node", "--format", SEP.join(SINFO_NODE_FIELDS)]
    return argv + (["--nodes", nodeset.fold(nodes)] if nodes else [])


def squeue_argv(jobs: Sequence[str] = (), user: str | None = None) -> list[str]:
    argv = ["squeue", "--noheader", "--format", SEP.join(SQUEUE_FIELDS)]
    if jobs:
        argv += ["--jobs", ",".join(jobs)]
    if user:
        argv += ["--user", user]
    return argv


def sacct_argv(jobs: Sequence[str]) -> list[str]:
    return ["sacct", "--parsable2", "--noheader", "--allocations", "--jobs", ",".join(jobs),
            "--format", ",".join(SACCT_FIELDS)]


def show_argv(kind: str, name: str | None = None) -> list[str]:
    """``scontrol show node|job|partition [NAME]`` (key=value text, one block per record)."""
    if kind not in ("node", "job", "partition"):
        raise ValueError(f"scontrol show {kind}: not a kind clustertool reads")
    return ["scontrol", "show", kind] + ([name] if name else [])


def ping_argv() -> list[str]:
    return ["scontrol", "ping"]


def slurmd_config_argv() -> list[str]:
    """``slurmd -C``: the machine's size as slurm.conf wants it (no daemon needed)."""
    return ["slurmd", "-C"]


def version_argv(program: str = "slurmd") -> list[str]:
    return [program, "-V"]


# ---- changing things: drains, cancels, requeues -----------------------------------------------------

def drain_argv(nodes: Sequence[str], reason: str) -> list[str]:
    """Drain ``nodes``: running jobs finish, no new job starts there (clustertool's cordon)."""
    if not reason.strip():
        raise ValueError("a drain needs a reason (Slurm refuses one without)")
    return ["scontrol", "update", f"NodeName={nodeset.fold(nodes)}", "State=DRAIN", f"Reason={reason}"]


def resume_argv(nodes: Sequence[str]) -> list[str]:
    return ["scontrol", "update", f"NodeName={nodeset.fold(nodes)}", "State=RESUME"]


def requeue_argv(job: str) -> list[str]:
    return ["scontrol", "requeue", job]


def scancel_argv(jobs: Sequence[str], signal: str | None = None) -> list[str]:
    if not jobs:
        raise ValueError("scancel needs a job")
    return ["scancel"] + ([f"--signal={signal}"] if signal else []) + list(jobs)


# ---- starting work -------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchSpec:
    """One ``sbatch`` submission.  ``script``: a file on the submitting node, or ``wrap``: one shell line."""

    script: str | None = None
    wrap: str | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    exclusive: bool = True         # training takes whole nodes
    nodelist: Sequence[str] = ()
    exclude: Sequence[str] = ()    # cordoned nodes
    job_name: str | None = None
    output: str | None = None      # %j: the job id
    error: str | None = None
    chdir: str | None = None
    dependency: str | None = None  # e.g. afterany:123 (run --after)
    requeue: bool | None = None    # None: Slurm's default (JobRequeue=1)
    partition: str | None = None
    time_limit: str | None = None
    export: str = "ALL"
    extra: Sequence[str] = field(default_factory=tuple)


def _node_options(nodes: int | None, nodelist: Sequence[str], exclude: Sequence[str]) -> list[str]:
    argv = [f"--nodes={nodes}"] if nodes else []
    if nodelist:
        argv.append(f"--nodelist={nodeset.fold(nodelist)}")
    if exclude:
        argv.append(f"--exclude={nodeset.fold(exclude)}")
    return argv


def sbatch_argv(spec: BatchSpec) -> list[str]:
    """``sbatch --parsable ...``: prints ``JOBID`` (or ``JOBID;CLUSTER``) and nothing else."""
    if (spec.script is None) == (spec.wrap is None):
        raise ValueError("sbatch takes a script or a wrapped command, one of them")
    argv = ["sbatch", "--parsable", f"--export={spec.export}"]
    argv += _node_options(spec.nodes, spec.nodelist, spec.exclude)
    for flag, value in (("--ntasks-per-node", spec.ntasks_per_node), ("--gpus-per-node", spec.gpus_per_node),
                        ("--job-name", spec.job_name), ("--output", spec.output), ("--error", spec.error),
                        ("--chdir", spec.chdir), ("--dependency", spec.dependency),
                        ("--partition", spec.partition), ("--time", spec.time_limit)):
        if value is not None:
            argv.append(f"{flag}={value}")
    if spec.exclusive:
        argv.append("--exclusive")
    if spec.requeue is not None:
        argv.append("--requeue" if spec.requeue else "--no-requeue")
    argv += list(spec.extra)
    return argv + ([spec.script] if spec.script is not None else [f"--wrap={spec.wrap}"])


@dataclass(frozen=True)
class StepSpec:
    """One ``srun`` step (inside an allocation, or making its own)."""

    command: Sequence[str]
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    nodelist: Sequence[str] = ()
    exclude: Sequence[str] = ()
    label: bool = False            # prefix each output line with its task number
    kill_on_bad_exit: bool = True  # one failing task ends the step
    output: str | None = None      # %t: task number, %n: node-relative, %N: node name
    error: str | None = None
    export: str | None = None
    mpi: str | None = None         # e.g. pmix, pmi2 (srun starting MPI ranks itself)
    overlap: bool = False
    extra: Sequence[str] = field(default_factory=tuple)


def srun_argv(spec: StepSpec) -> list[str]:
    if not spec.command:
        raise ValueError("srun needs a command")
    argv = ["srun"] + _node_options(spec.nodes, spec.nodelist, spec.exclude)
    for flag, value in (("--ntasks", spec.ntasks), ("--ntasks-per-node", spec.ntasks_per_node),
                        ("--output", spec.output), ("--error", spec.error), ("--export", spec.export),
                        ("--mpi", spec.mpi)):
        if value is not None:
            argv.append(f"{flag}={value}")
    argv.append(f"--kill-on-bad-exit={1 if spec.kill_on_bad_exit else 0}")
    if spec.label:
        argv.append("--label")
    if spec.overlap:
        argv.append("--overlap")
    return argv + list(spec.extra) + ["--", *spec.command]


# ---- daemons -------------------------------------------------------------------------------------

def slurmctld_argv(layout: Layout) -> list[str]:
    return ["slurmctld", "-f", layout.slurm_conf]


def slurmd_argv(layout: Layout, node: str) -> list[str]:
    """slurmd as ``node`` (``-N``: a machine's hostname need not be its Slurm name)."""
    return ["slurmd", "-f", layout.slurm_conf, "-N", node]
