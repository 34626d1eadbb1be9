"""The mpirun command line of a job, as a pure function of the hosts and the options.

Defaults follow the seeds' manual workflow: ``-bind-to none -map-by slot``, ``pml ob1``,
``btl ^openib``, TCP restricted to the cluster's own network (both the MPI byte transfer
layer and Open MPI's out-of-band channel), one ``-x`` per exported variable, Horovod knobs
as ``HOROVOD_*`` variables and the plugin's environment with ``--plugin``.

Rank output goes to per-rank files (``--output-filename DIR:nocopy``) when ``output_dir`` is set,
which `clustertool run` always does: mpirun itself forwards output in fragments, not lines.

Every rank runs under a tiny ``sh`` wrapper that records, on its own node, the rank's pid,
parent (the orted daemon), process group and session in the job's directory, then execs
the program: that is what ``kill`` uses to stop a job by its processes, not by their names.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from clustertool.core.errors import UsageError
from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR, RANK_HOST_ENV

VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Records "pid ppid pgid sid" of the rank (after exec the wrapper's pid is the rank's) in
# ~/.clustertool/jobs/<job>/ranks/<host>.<rank> on the rank's node, stops there when `kill` has
# already marked the job on this node (a rank started after kill looked for processes), gives the rank the variables
# torch.distributed's env:// (and most launchers' scripts) read, from Open MPI's own, then runs the
# program.  NODE_RANK: the node whose first rank (CLUSTERTOOL_RANK_STARTS, in hostfile order, as
# `-map-by slot` fills the nodes) is the last one at or below this rank.  A program that is not there
# is the node's ``failure`` (rank, exit 127, when; as the job agent writes it): mpirun's own log does not
# always name a rank that could not start, so `jobs` and `run --follow` would not say which and why.
RANK_WRAPPER = (
    'd="$HOME/' + JOBS_DIR + '/$' + JOB_ENV + '/ranks"; mkdir -p "$d"; '
    'read -r p _ _ pp pg sid _ < /proc/$$/stat; '
    'echo "$p $pp $pg $sid" > "$d/$(uname -n).${OMPI_COMM_WORLD_RANK:-$$}"; '
    '[ -f "$d/../killed" ] && exit 143; '
    'if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE" '
    'CLUSTERTOOL_GPUS_PER_NODE="$OMPI_COMM_WORLD_LOCAL_SIZE"; '
    'n=0; NODE_RANK=0; for s in ${CLUSTERTOOL_RANK_STARTS:-0}; do '
    '[ "$RANK" -ge "$s" ] && NODE_RANK=$n; n=$((n + 1)); done; '
    'export NODE_RANK CLUSTERTOOL_NODE_RANK="$NODE_RANK"; fi; '
    'h="$HOME/${' + RANK_HOST_ENV + ':-}"; unset ' + RANK_HOST_ENV + '; case "${1##*/}" in python|python[0-9]*) '
    'case "${2:-}" in -m|[!-]*) [ -f "$h" ] && { p=$1; shift; set -- "$p" "$h" "$@"; };; esac;; esac; '
    'command -v "$1" >/dev/null 2>&1 || { echo "ct-rank: $1: not found" >&2; [ -f "$d/../failure" ] || '
    'printf \'{"rank": %s, "code": 127, "time": %s}\\n\' "${OMPI_COMM_WORLD_RANK:-0}" "$(date +%s)" '
    '> "$d/../failure"; exit 127; }; '
    'exec "$@"'
)


@dataclass
class MpiOptions:
    """What `clustertool run` asks of mpirun (everything but the hosts)."""

    command: list[str]
    np: int | None = None
    per_node: int | None = None
    env: list[str] = field(default_factory=list)  # "VAR" (the leader's value) or "VAR=VALUE"
    mpi_args: list[str] = field(default_factory=list)
    plugin_env: dict[str, str] = field(default_factory=dict)
    rank_env: dict[str, str] = field(default_factory=dict)  # the job-wide rank variables (jobs/jobplan.py)
    horovod_fusion_mb: float | None = None
    horovod_cycle_ms: float | None = None
    horovod_timeline: str | None = None
    horovod_autotune: bool = False
    nccl_debug: str | None = None
    workdir: str | None = None
    oversubscribe: bool = False
    as_root: bool = False
    subnet: str | None = None  # CIDR of the cluster network, for TCP interface selection
    hostfile: str | None = None  # use --hostfile PATH (its content: job_hostfile) instead of -H
    job_id: str | None = None  # exported as CLUSTERTOOL_JOB and used by the rank wrapper
    tag_output: bool = True  # lines shown as [job,rank]<stream>:text (mpirun's --tag-output without output_dir)
    unbuffered: bool = True  # PYTHONUNBUFFERED=1 so logs are live
    output_dir: str | None = None  # per-rank output files there, on each rank's node (--output-filename)
    launcher: str | None = None  # mpirun | torchrun | accelerate | deepspeed | process; None: by the command
    rank_wrapper: bool = True  # each rank under RANK_WRAPPER (off for the node agents of other launchers)
    allocation: bool = False  # inside a Slurm allocation: no host list, mpirun takes the allocation's nodes


def split_command(args: Sequence[str]) -> list[str]:
    """One argument with spaces is a command line, split as a shell would (no shell features):
    `run -- "python train.py --lr 0.1"` works like `run -- python train.py --lr 0.1`."""
    args = list(args)
    if len(args) == 1 and any(c.isspace() for c in args[0]):
        try:
            return shlex.split(args[0])
        except ValueError as exc:
            raise UsageError(f"cannot split the command {args[0]!r}: {exc}") from None
    return args


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def env_items(opts: MpiOptions) -> list[str]:
    """The ``-x`` items, in order: job marker, knobs, plugin, then the user's own."""
    items: list[str] = []
    if opts.job_id:
        items.append(f"{JOB_ENV}={opts.job_id}")
    if opts.unbuffered:
        items.append("PYTHONUNBUFFERED=1")
    if opts.horovod_fusion_mb is not None:
        if opts.horovod_fusion_mb < 0:
            raise UsageError("--horovod-fusion-mb must be 0 or more")
        items.append(f"HOROVOD_FUSION_THRESHOLD={int(opts.horovod_fusion_mb * 1024 * 1024)}")
    if opts.horovod_cycle_ms is not None:
        if opts.horovod_cycle_ms <= 0:
            raise UsageError("--horovod-cycle-ms must be positive")
        items.append(f"HOROVOD_CYCLE_TIME={_number(opts.horovod_cycle_ms)}")
    if opts.horovod_timeline:
        items.append(f"HOROVOD_TIMELINE={opts.horovod_timeline}")
    if opts.horovod_autotune:
        items.append("HOROVOD_AUTOTUNE=1")
    if opts.nccl_debug:
        items.append(f"NCCL_DEBUG={opts.nccl_debug}")
    items += [f"{k}={v}" for k, v in opts.rank_env.items()]
    items += [f"{k}={v}" for k, v in opts.plugin_env.items()]
    for item in opts.env:
        name = item.split("=", 1)[0]
        if not VAR_RE.match(name):
            raise UsageError(f"-x {item!r}: {name!r} is not a valid environment variable name",
                             hint="use -x NAME=VALUE or -x NAME (letters, digits, '_')")
        items.append(item)
    return items


def placement(hosts: Sequence[tuple[str, int]], opts: MpiOptions) -> tuple[list[tuple[str, int]], int]:
    """Slots per host after ``--per-node`` and the number of ranks; errors say what fits."""
    if not hosts:
        raise UsageError("no nodes selected to run on")
    if opts.per_node is not None:
        if opts.per_node < 1:
            raise UsageError("--per-node must be at least 1",
                             hint="e.g. --per-node 1 (default: every slot of each node)")
        small = [(a, s) for a, s in hosts if s < opts.per_node]
        if small and not opts.oversubscribe:
            a, s = small[0]
            raise UsageError(f"--per-node {opts.per_node} is more than the {s} slot(s) of {a}",
                             hint="lower --per-node, or add --oversubscribe")
        hosts = [(a, opts.per_node) for a, _ in hosts]
    total = sum(s for _, s in hosts)
    np = total if opts.np is None else opts.np
    if np < 1:
        raise UsageError("--np must be at least 1", hint="e.g. --np 4 (default: every slot of the nodes)")
    if np > total and not opts.oversubscribe:
        raise UsageError(f"--np {np} is more than the {total} slot(s) of the {len(hosts)} selected node(s)",
                         hint="lower --np, select more nodes, or add --oversubscribe to run more ranks than slots")
    return list(hosts), np


def job_hostfile(hosts: Sequence[tuple[str, int]]) -> str:
    """The job's own Open MPI hostfile (leader first), for ``--hostfile``."""
    return "".join(f"{addr} slots={slots}\n" for addr, slots in hosts)


def build_argv(hosts: Sequence[tuple[str, int]], opts: MpiOptions) -> list[str]:
    """The full mpirun argv for ``hosts`` ([(address, slots)], leader first)."""
    if not opts.command:
        raise UsageError("no command given", hint="clustertool run -- python train.py")
    hosts, np = placement(hosts, opts)
    argv = ["mpirun"]
    if opts.as_root:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(np)]
    if opts.allocation:
        pass  # Open MPI reads SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE, and starts its daemons with srun
    elif opts.hostfile:
        argv += ["--hostfile", opts.hostfile]
    else:
        argv += ["-H", ",".join(f"{a}:{s}" for a, s in hosts)]
    if opts.oversubscribe:
        argv.append("--oversubscribe")
    argv += ["-bind-to", "none", "-map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib"]
    if opts.subnet:
        argv += ["--mca", "btl_tcp_if_include", opts.subnet, "--mca", "oob_tcp_if_include", opts.subnet]
    else:
        argv += ["--mca", "btl_tcp_if_exclude", "lo,docker0", "--mca", "oob_tcp_if_exclude", "lo,docker0"]
    if opts.output_dir:
        # Each rank's daemon writes the rank's bytes, untouched, to OUT/1/rank.N/std{out,err} on the
        # rank's node; "nocopy": not also through mpirun, which forwards fragments (and drops some).
        # No --tag-output: Open MPI would tag every fragment inside the files; lines are tagged
        # when read (nodeprogs/ranklog.py).
        argv += ["--output-filename", f"{opts.output_dir}:nocopy"]
    elif opts.tag_output:
        argv.append("--tag-output")
    if opts.workdir:
        argv += ["-wdir", opts.workdir]
    for item in env_items(opts):
        argv += ["-x", item]
    argv += list(opts.mpi_args)
    if opts.job_id and opts.rank_wrapper:
        argv += ["sh", "-c", RANK_WRAPPER, "ct-rank"]
    return argv + list(opts.command)


def cluster_subnet(addresses: Sequence[str], declared: str | None = None) -> str | None:
    """The CIDR that holds every node address: a declared one if it does, else the
    narrowest of /24, /16 that does; None when the addresses share neither."""
    try:
        ips = [ipaddress.ip_address(a) for a in addresses]
    except ValueError:
        return None  # host names: let Open MPI pick, minus loopback/docker
    if not ips:
        return None
    if declared:
        try:
            net = ipaddress.ip_network(declared, strict=False)
            if all(ip in net for ip in ips):
                return str(net)
        except ValueError:
            pass
    for prefix in (24, 16):
        net = ipaddress.ip_network(f"{ips[0]}/{prefix}", strict=False)
        if all(ip in net for ip in ips):
            return str(net)
    return None
