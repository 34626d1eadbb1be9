"""What starts a job's ranks: mpirun (the default), torchrun, accelerate, deepspeed, or the tool
itself (``process``), as pure functions of the command and the rank layout.

Every launcher but mpirun runs as one *node launcher* per node.  The leader's fan-out (nodeprogs/fan.py,
in mpirun's place) starts every node's agent at once over its ssh, as pdsh would, and keeps every promise
`run` makes (detached on the leader, `kill` by the job's processes, the whole job stopped when one node's
launcher fails or its node is lost).  On each node the job agent (nodeprogs/jobagent.py) starts
that node's launcher with the node's own flags (its node rank, its number of processes), or, for
``process``, one process per slot itself.  Each rank then runs under the agent's rank runner, which
writes its output to the same per-rank files mpirun's ranks use and records how it ended.

``detect`` turns ``torchrun train.py``, ``python -m torch.distributed.run train.py``,
``accelerate launch train.py`` and ``deepspeed train.py`` into their launcher, the user's own
launcher options kept; an explicit ``--launcher X -- train.py`` gives the same plan.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Iterable

from clustertool.core.errors import UsageError

LAUNCHERS = ("mpirun", "torchrun", "accelerate", "deepspeed", "process")
AGENT = "{agent}"  # the job agent's path on the node, filled in there
PORT = "{port}"  # MASTER_PORT, filled in on the node from the job's environment
DS_HOSTFILE = "{ds_hostfile}"  # the job's DeepSpeed hostfile on the node, written there by the agent
# accelerate's multi-process modes: without one, `accelerate launch` starts a single process per call
_ACCELERATE_MODES = {"--multi_gpu", "--multi-gpu", "--use_deepspeed", "--use-deepspeed", "--use_fsdp", "--use-fsdp",
                     "--use_megatron_lm", "--use-megatron-lm", "--tpu"}
TORCHRUN_MODULE = "torch.distributed.run"

# Options of each launcher that take no value (everything else starting with '-' takes one,
# unless written --opt=value): what tells a launcher's options from the training script.
_FLAGS = {
    "torchrun": {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                 "--virtual-local-rank", "--virtual_local_rank"},
    "accelerate": {"--cpu", "--multi_gpu", "--multi-gpu", "--tpu", "--use_deepspeed", "--use-deepspeed",
                   "--use_fsdp", "--use-fsdp", "--use_megatron_lm", "--use-megatron-lm", "-m", "--module",
                   "--no_python", "--no-python", "--debug", "-q", "--quiet", "--same_network", "--same-network",
                   "--enable_cpu_affinity", "--enable-cpu-affinity", "--ipex", "--use_xpu", "--use-xpu",
                   "--tpu_use_cluster", "--tpu-use-cluster", "--tpu_use_sudo", "--tpu-use-sudo"},
    "deepspeed": {"--no_python", "--no-python", "--module", "-m", "--no_local_rank", "--no-local-rank",
                  "--no_ssh", "--no-ssh", "--no_ssh_check", "--no-ssh-check", "--save_pid", "--save-pid",
                  "--autotuning", "--force_multi", "--force-multi", "--elastic_training", "--bind_cores_to_rank",
                  "--enable_each_rank_log"},
}
# Options the tool sets itself for a multi-node launch: given by the user, they would contradict it.
_OWNED = {
    "torchrun": {"--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr", "--master-port",
                 "--master_port", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--standalone"},
    "accelerate": {"--num_machines", "--num-machines", "--machine_rank", "--machine-rank", "--main_process_ip",
                   "--main-process-ip", "--main_process_port", "--main-process-port", "--num_processes",
                   "--num-processes"},
    "deepspeed": {"-H", "--hostfile", "--num_nodes", "--num-nodes", "--node_rank", "--node-rank", "--master_addr",
                  "--master-addr", "--master_port", "--master-port", "--num_gpus", "--num-gpus", "--include",
                  "-i", "--exclude", "-e", "--no_ssh", "--no-ssh", "--launcher"},
}
_NPROC = {"torchrun": ("--nproc-per-node", "--nproc_per_node"), "deepspeed": ("--num_gpus", "--num-gpus")}


@dataclass(frozen=True)
class LaunchSpec:
    """A command taken apart: which launcher, the user's options for it, and the program it runs."""

    kind: str = "mpirun"
    program: tuple[str, ...] = ()  # the training script and its arguments (mpirun/process: the whole command)
    options: tuple[str, ...] = ()  # the user's own options for the launcher
    prefix: tuple[str, ...] = ()  # how to start the launcher: ("torchrun",), ("python3", "-m", ...), ...
    mode: str = "python"  # how each rank runs ``program``: python (a script), module (-m), exec (--no-python)
    per_node: int | None = None  # --nproc-per-node the user gave the launcher

    @property
    def node_launcher(self) -> bool:
        return self.kind not in ("mpirun",)


def _base(word: str) -> str:
    return os.path.basename(word)


def _is_python(word: str) -> bool:
    base = _base(word)
    return base.startswith("python") and all(c.isdigit() or c == "." for c in base[len("python"):])


def detect(command: list[str]) -> str:
    """The launcher a command names by its program: torchrun, python -m torch.distributed.run,
    accelerate launch, deepspeed; everything else: mpirun."""
    if not command:
        return "mpirun"
    first = _base(command[0])
    if first == "torchrun" or (_is_python(command[0]) and command[1:3] == ["-m", TORCHRUN_MODULE]):
        return "torchrun"
    if first == "accelerate" and command[1:2] == ["launch"]:
        return "accelerate"
    if first == "deepspeed":
        return "deepspeed"
    return "mpirun"


def _split_options(kind: str, words: list[str]) -> tuple[list[str], list[str]]:
    """(the launcher's options, the program and its arguments)."""
    flags = _FLAGS.get(kind, set())
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            return words[:i], words[i + 1:]
        if not w.startswith("-") or w == "-":
            break
        i += 1 if (w in flags or "=" in w) else 2
    return words[:i], words[i:]


def _opt_name(word: str) -> str:
    return word.split("=", 1)[0]


def _take_value(options: list[str], names: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The options without ``names`` (and their values); the last value given."""
    kept, value, i = [], None, 0
    while i < len(options):
        w = options[i]
        if _opt_name(w) in names:
            if "=" in w:
                value = w.split("=", 1)[1]
                i += 1
            else:
                value = options[i + 1] if i + 1 < len(options) else None
                i += 2
            continue
        kept.append(w)
        i += 1
    return kept, value


def parse(command: list[str], launcher: str | None = None) -> LaunchSpec:
    """The plan's view of ``command`` under ``launcher`` (None: detected from the command)."""
    if launcher is not None and launcher not in LAUNCHERS:
        near = difflib.get_close_matches(launcher, LAUNCHERS, n=1)
        raise UsageError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}",
                         hint=f"did you mean --launcher {near[0]}?" if near else "e.g. --launcher torchrun")
    found = detect(command)
    kind = launcher or found
    if kind in ("mpirun", "process"):
        if found != "mpirun":
            raise UsageError(f"the command starts {found} itself, but --launcher is {kind}",
                             hint=f"use --launcher {found} (or leave --launcher out), or run the script directly")
        return LaunchSpec(kind, tuple(command))
    if found not in ("mpirun", kind):
        raise UsageError(f"the command starts {found}, but --launcher is {kind}",
                         hint="leave --launcher out: the command's own launcher is used")
    if found == kind:  # the user wrote the launcher: take its program words off
        if kind == "torchrun" and _is_python(command[0]):
            prefix, rest = tuple(command[:3]), command[3:]
        elif kind == "accelerate":
            prefix, rest = tuple(command[:2]), command[2:]
        else:
            prefix, rest = (command[0],), command[1:]
    else:  # --launcher X -- [python] train.py ...
        rest = list(command)
        python = rest.pop(0) if rest and _is_python(rest[0]) else None
        prefix = _default_prefix(kind, python)
    options, program = _split_options(kind, rest)
    if not program:
        raise UsageError(f"no training script after the {kind} options",
                         hint=f"clustertool run -- {kind if kind != 'accelerate' else 'accelerate launch'} train.py")
    owned = sorted({_opt_name(o) for o in options if o.startswith("-")} & _OWNED[kind])
    if owned:
        raise UsageError(f"{kind}: leave out {', '.join(owned)}: clustertool sets them for each node",
                         hint="--nodes/--per-node choose the nodes and processes; MASTER_ADDR/PORT are chosen per job")
    per_node = None
    if kind in _NPROC:
        options, value = _take_value(options, _NPROC[kind])
        per_node = _count(kind, value)
    mode = "python"
    words = {_opt_name(o) for o in options}
    if words & {"--no-python", "--no_python"}:
        mode = "exec"
        options = [o for o in options if _opt_name(o) not in ("--no-python", "--no_python")]
    elif words & {"-m", "--module"}:
        mode = "module"
        options = [o for o in options if _opt_name(o) not in ("-m", "--module")]
    return LaunchSpec(kind, tuple(program), tuple(options), prefix, mode, per_node)


def _count(kind: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{kind}: {_NPROC[kind][0]} {value!r}: give a number of processes (at least 1)",
                         hint="or leave it out: each node runs one process per slot")
    return int(value)


def _default_prefix(kind: str, python: str | None) -> tuple[str, ...]:
    if kind == "torchrun":
        return (python, "-m", TORCHRUN_MODULE) if python else ("torchrun",)
    if kind == "accelerate":
        return (python, "-m", "accelerate.commands.launch") if python else ("accelerate", "launch")
    return (python, "-m", "deepspeed.launcher.runner") if python else ("deepspeed",)


@dataclass(frozen=True)
class NodeShare:
    """One node's part of the job: its rank among the nodes, its processes, its first rank."""

    node_rank: int
    nprocs: int
    first_rank: int


@dataclass(frozen=True)
class Rendezvous:
    addr: str  # the leader's cluster address
    job_id: str
    world_size: int
    nnodes: int


def node_argv(spec: LaunchSpec, share: NodeShare, rdzv: Rendezvous) -> list[str]:
    """The launcher command one node runs (its training script: the agent's rank runner)."""
    k, p = share, PORT
    if spec.kind == "torchrun":
        # Static rendezvous (torchrun's default): node rank k gets ranks k*nproc.., in the hostfile's
        # order, as mpirun numbers them, rank 0 on the leader; the leader's agent hosts the store.
        # A user who asked for c10d keeps it, at the leader's address, this job's id.
        own = list(spec.options)
        argv = [*spec.prefix, "--nnodes", str(rdzv.nnodes), "--nproc-per-node", str(k.nprocs),
                "--node-rank", str(k.node_rank)]
        backend = _value_of(own, ("--rdzv-backend", "--rdzv_backend"))
        if backend not in (None, "static"):
            argv += ["--rdzv-endpoint", f"{rdzv.addr}:{p}", "--rdzv-id", rdzv.job_id]
        else:
            argv += ["--master-addr", rdzv.addr, "--master-port", p]
        return argv + own + [AGENT] + _runner_args(spec)
    if spec.kind == "accelerate":
        # `--multi_gpu` is accelerate's torchrun path (static rendezvous, --machine_rank as the node rank),
        # on CPU nodes too; `--cpu` (a single process per call) becomes ACCELERATE_USE_CPU=1 (job agent).
        own = [o for o in spec.options if o != "--cpu"]
        mode = [] if {_opt_name(o) for o in own} & _ACCELERATE_MODES else ["--multi_gpu"]
        return [*spec.prefix, *mode, "--num_machines", str(rdzv.nnodes), "--machine_rank", str(k.node_rank),
                "--main_process_ip", rdzv.addr, "--main_process_port", p, "--num_processes",
                str(rdzv.world_size), *own, AGENT, *_runner_args(spec)]
    if spec.kind == "deepspeed":
        # The per-node form without ssh: DeepSpeed's runner still wants a hostfile (node_rank indexes it)
        # and the master's address (else it asks the first host over ssh).
        return [*spec.prefix, "--hostfile", DS_HOSTFILE, "--no_ssh", "--num_nodes", str(rdzv.nnodes),
                "--node_rank", str(k.node_rank), "--master_addr", rdzv.addr, "--master_port", p,
                "--num_gpus", str(k.nprocs), *spec.options, AGENT, *_runner_args(spec)]
    raise ValueError(f"{spec.kind} has no node launcher")


def _runner_args(spec: LaunchSpec) -> list[str]:
    """What follows the rank runner on the launcher's command line: the user's program arguments
    (the program itself reaches the runner through its environment, see jobagent.py)."""
    return list(spec.program[1:])


def _value_of(options: Iterable[str], names: tuple[str, ...]) -> str | None:
    return _take_value(list(options), names)[1]


def wants_cpu(spec: LaunchSpec) -> bool:
    """accelerate told --cpu: its ranks run with ACCELERATE_USE_CPU=1 (the agent also sets it on nodes
    without an NVIDIA GPU, where accelerate would otherwise run each rank undistributed)."""
    return spec.kind == "accelerate" and "--cpu" in spec.options


def rank_program(spec: LaunchSpec) -> dict:
    """What the rank runner starts for each rank: {"mode": python|module|exec, "target": ...}."""
    if spec.kind == "process":
        return {"mode": "exec", "argv": list(spec.program)}
    return {"mode": spec.mode, "target": spec.program[0]}
