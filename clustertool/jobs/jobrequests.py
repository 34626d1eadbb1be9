"""What a user asks of `run`, as one typed value: built alike by the CLI (from its flags) and the API
(from keywords, :meth:`RunRequest.of`), checked once when it is made, handed whole to the core.

A bad value is one ``UsageError`` naming the flag the user typed (``--restarts -1: ...``), with a hint;
a request that exists is a valid one (every dataclass here checks itself in ``__post_init__``).  What
can only be checked against a cluster (the nodes, the slots, spot notices) is checked by the plan.
The job's record (core.model.JobRecord) is derived from the request and the plan (jobs/launch.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from clustertool.core.errors import UsageError
from clustertool.jobs.mpirun import MpiOptions

SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2")  # what --on-preempt-signal may name
DEFAULT_REPLACE_WAIT_S = 600.0
HANG_ACTIONS = ("keep", "kill")


@dataclass(frozen=True)
class HangPolicy:
    """run --hang-timeout / --hang-action: when no rank wrote a line and no CPU time moved for
    ``timeout`` seconds, the supervisor saves every rank's stack and marks the job hung (``kill``: stops it)."""

    timeout: float | None = None
    action: str = "keep"

    def __post_init__(self) -> None:
        if self.timeout is not None and self.timeout < 1:
            raise UsageError(f"--hang-timeout {self.timeout:g}s is too short: give at least 1s (e.g. 10m)")
        if self.action not in HANG_ACTIONS:
            raise UsageError(f"--hang-action {self.action!r}: use keep (say so, leave it running) or kill",
                             hint="--hang-timeout 10m --hang-action kill")
        if self.action == "kill" and self.timeout is None:
            raise UsageError("--hang-action kill goes with --hang-timeout", hint="clustertool run --hang-timeout 10m "
                             "--hang-action kill -- CMD")


@dataclass(frozen=True)
class RestartPolicy:
    """run --restarts N / --restart-on-exit-codes: the leader starts a failed job again, up to ``count``
    times (``exit_codes``: only for these, sorted; None: any failure)."""

    count: int = 0
    exit_codes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.count < 0:
            raise UsageError(f"--restarts {self.count}: give 0 or more (how many times a failed job starts again)",
                             hint="e.g. --restarts 2")
        if self.exit_codes is None:
            return
        if not self.count:
            raise UsageError("--restart-on-exit-codes goes with --restarts N",
                             hint="clustertool run --restarts 2 --restart-on-exit-codes 137 -- CMD")
        bad = [c for c in self.exit_codes if not 1 <= c <= 255]
        if bad or not self.exit_codes:
            raise UsageError(f"--restart-on-exit-codes: {bad[0] if bad else 'nothing'} is not an exit code "
                             "that fails (1-255)", hint="e.g. --restart-on-exit-codes 1,137 (137: killed by "
                                                        "signal 9, 128+signal)")
        object.__setattr__(self, "exit_codes", tuple(sorted(set(self.exit_codes))))


@dataclass(frozen=True)
class RecoveryPolicy:
    """run --replace-failed / --replace-wait / --on-preempt-signal: a lost node is replaced (by the
    recovery loop where the credentials are) within ``replace_wait`` seconds, then the job restarts;
    ``on_preempt_signal`` (TERM, USR1 ...): what every rank gets on a spot interruption notice."""

    replace_failed: bool = False
    replace_wait: float | None = None  # None: DEFAULT_REPLACE_WAIT_S with replace_failed
    on_preempt_signal: str | None = None

    def __post_init__(self) -> None:
        if self.replace_wait is not None and not self.replace_failed:
            raise UsageError("--replace-wait goes with --replace-failed",
                             hint="clustertool run --restarts 1 --replace-failed --replace-wait 10m -- CMD")
        if self.replace_wait is not None and self.replace_wait < 10:
            raise UsageError(f"--replace-wait {self.replace_wait:g}s is too short: a replacement takes longer "
                             "(e.g. 10m)")
        if self.on_preempt_signal is not None:
            sig = self.on_preempt_signal.strip().upper().removeprefix("SIG")
            if sig not in SIGNALS:
                raise UsageError(f"--on-preempt-signal {self.on_preempt_signal!r}: use {', '.join(SIGNALS)}",
                                 hint="e.g. --on-preempt-signal USR1 (TERM by default)")
            object.__setattr__(self, "on_preempt_signal", sig)

    @property
    def wait_s(self) -> float | None:
        """How long the leader waits for a replacement (None: it does not wait)."""
        return (self.replace_wait or DEFAULT_REPLACE_WAIT_S) if self.replace_failed else None


@dataclass(frozen=True)
class SyncPolicy:
    """run --sync [DIR] / --sync-to PATH: DIR sent first to PATH (default: DIR's own path) on the job's nodes."""

    dir: str = "."
    to: str | None = None

    def __post_init__(self) -> None:
        self.target()  # the folder exists here, the path there is absolute

    def target(self) -> tuple[str, str]:
        """(the local folder, its path on the nodes): the job's working directory."""
        from clustertool.jobs import syncdir  # the copy's modules: only for a run that syncs

        return syncdir.resolve(self.dir, self.to)


@dataclass(frozen=True)
class HorovodKnobs:
    """run --horovod-fusion-mb / --horovod-cycle-ms / --horovod-timeline / --horovod-autotune."""

    fusion_mb: float | None = None
    cycle_ms: float | None = None
    timeline: str | None = None
    autotune: bool = False

    def __post_init__(self) -> None:
        if self.fusion_mb is not None and self.fusion_mb < 0:
            raise UsageError("--horovod-fusion-mb must be 0 or more")
        if self.cycle_ms is not None and self.cycle_ms <= 0:
            raise UsageError("--horovod-cycle-ms must be positive")


@dataclass(frozen=True)
class LaunchOptions:
    """How the ranks start: the launcher, how many, their environment and mpirun's own options."""

    launcher: str | None = None  # mpirun | torchrun | accelerate | deepspeed | process; None: by the command
    np: int | None = None
    per_node: int | None = None
    env: tuple[str, ...] = ()  # "VAR" (the leader's value) or "VAR=VALUE"
    mpi_args: tuple[str, ...] = ()
    horovod: HorovodKnobs = HorovodKnobs()
    nccl_debug: str | None = None
    workdir: str | None = None
    oversubscribe: bool = False
    tag_output: bool = True

    def __post_init__(self) -> None:
        if self.per_node is not None and self.per_node < 1:
            raise UsageError("--per-node must be at least 1",
                             hint="e.g. --per-node 1 (default: every slot of each node)")
        if self.np is not None and self.np < 1:
            raise UsageError("--np must be at least 1", hint="e.g. --np 4 (default: every slot of the nodes)")

    def mpi_options(self, command: Sequence[str]) -> MpiOptions:
        """What mpirun is asked (everything but the hosts, which the plan adds)."""
        h = self.horovod
        return MpiOptions(command=list(command), np=self.np, per_node=self.per_node, env=list(self.env),
                          mpi_args=list(self.mpi_args), horovod_fusion_mb=h.fusion_mb, horovod_cycle_ms=h.cycle_ms,
                          horovod_timeline=h.timeline, horovod_autotune=h.autotune, nccl_debug=self.nccl_debug,
                          workdir=self.workdir, oversubscribe=self.oversubscribe, tag_output=self.tag_output,
                          launcher=self.launcher)


@dataclass(frozen=True)
class RunRequest:
    """One `clustertool run`: the command and every option, checked."""

    command: tuple[str, ...]
    nodes: str | None = None  # the rank nodes (default: every worker not cordoned)
    name: str | None = None
    launch: LaunchOptions = LaunchOptions()
    plugin: bool = False  # the deployed plugin's environment (and the reducers on the servers)
    sync: SyncPolicy | None = None
    allow_concurrent: bool = False
    hang: HangPolicy = HangPolicy()
    restarts: RestartPolicy = RestartPolicy()
    recovery: RecoveryPolicy = RecoveryPolicy()
    after: str | None = None  # a Slurm cluster: start once this job (id or name) has ended, however it ended
    record: bool = True  # the job's watch recorder on the leader (what `report JOB` draws); --no-record: none
    checkpoint_dir: str | None = None  # where the job checkpoints (CLUSTERTOOL_CHECKPOINT_DIR on every rank)

    def __post_init__(self) -> None:
        if self.checkpoint_dir is not None and (not self.checkpoint_dir.strip() or "\n" in self.checkpoint_dir):
            raise UsageError("--checkpoint-dir: give a folder (on a shared filesystem, e.g. /shared/ckpt)",
                             hint="clustertool run --restarts 2 --checkpoint-dir /shared/ckpt -- CMD")
        if self.after is not None and not self.after.strip():
            raise UsageError("--after: give a job (its id or name)", hint="clustertool run --after JOB -- CMD")
        if not self.command:
            raise UsageError("no command given", hint="clustertool run -- python train.py")
        if self.recovery.replace_failed and self.restarts.count < 1:
            raise UsageError("--replace-failed goes with --restarts N (the restart after the replacement is one of "
                             "them)", hint="clustertool run --restarts 2 --replace-failed --follow -- CMD")

    def mpi_options(self) -> MpiOptions:
        options = self.launch.mpi_options(self.command)
        if self.checkpoint_dir is not None:  # every rank: where to checkpoint and resume from
            options.env.append(f"CLUSTERTOOL_CHECKPOINT_DIR={self.checkpoint_dir}")
        return options

    @classmethod
    def of(cls, command: str | Sequence[str], *, nodes: str | None = None, name: str | None = None,
           launcher: str | None = None, np: int | None = None, per_node: int | None = None,
           env: Mapping[str, object] | Iterable[str] | None = None, mpi_args: Sequence[str] = (),
           plugin: bool = False, nccl_debug: str | None = None, workdir: str | None = None,
           sync: str | os.PathLike[str] | bool | None = None, sync_to: str | None = None,
           oversubscribe: bool = False, allow_concurrent: bool = False, tag_output: bool = True,
           hang_timeout: float | None = None, hang_action: str = "keep", restarts: int = 0,
           restart_on_exit_codes: Iterable[int] | None = None, replace_failed: bool = False,
           replace_wait: float | None = None, on_preempt_signal: str | None = None,
           fusion_mb: float | None = None, cycle_ms: float | None = None, timeline: str | None = None,
           autotune: bool = False, after: str | None = None, record: bool = True,
           checkpoint_dir: str | None = None) -> "RunRequest":
        """The request from the flat keywords the API takes (the flags of `run`, in seconds where they
        take a TIME): ``command`` one string (a shell line) or a list of words; ``env`` ``{"A": 1}`` or
        ``["A=1", "B"]`` (B: the leader's value); ``sync`` a folder (``True``: this one); ``fusion_mb``,
        ``cycle_ms``, ``timeline``, ``autotune``: the --horovod-* flags; ``after``: a job this one waits for
        (a Slurm cluster); ``record=False``: --no-record; ``checkpoint_dir``: --checkpoint-dir."""
        hang = HangPolicy(hang_timeout, hang_action)  # checked in the order the flags were always checked
        restart = RestartPolicy(restarts, None if restart_on_exit_codes is None else
                                tuple(int(c) for c in restart_on_exit_codes))
        recovery = RecoveryPolicy(replace_failed, replace_wait, on_preempt_signal)
        if sync_to is not None and sync in (None, False):
            raise UsageError("--sync-to goes with --sync", hint="clustertool run --sync [DIR] --sync-to PATH -- CMD")
        folder = None if sync is None or sync is False else ("." if sync is True else os.fspath(sync))
        launch = LaunchOptions(launcher=launcher, np=np, per_node=per_node, env=_env(env),
                               mpi_args=tuple(str(a) for a in mpi_args),
                               horovod=HorovodKnobs(fusion_mb, cycle_ms, timeline, bool(autotune)),
                               nccl_debug=nccl_debug, workdir=workdir, oversubscribe=oversubscribe,
                               tag_output=tag_output)
        return cls(command=_words(command), nodes=nodes, name=name, launch=launch, plugin=plugin,
                   sync=None if folder is None else SyncPolicy(folder, sync_to), allow_concurrent=allow_concurrent,
                   hang=hang, restarts=restart, recovery=recovery, after=after, record=bool(record),
                   checkpoint_dir=checkpoint_dir)


def _words(command: str | Sequence[str]) -> tuple[str, ...]:
    """A command as the CLI gets it: one string is a shell line (split by the plan), a list is word by word."""
    if isinstance(command, str):
        return (command,) if command else ()
    return tuple(str(w) for w in command)


def _env(env: Mapping[str, object] | Iterable[str] | None) -> tuple[str, ...]:
    """``{"A": 1}`` or ``["A=1", "B"]`` (B: the leader's value) as run's -x items."""
    if env is None:
        return ()
    if isinstance(env, Mapping):
        return tuple(f"{k}={v}" for k, v in env.items())
    return tuple(str(item) for item in env)


def parse_exit_codes(text: str | None) -> list[int] | None:
    """``--restart-on-exit-codes``: "1,137" (None: not given)."""
    if text is None:
        return None
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if not words or not all(w.isdigit() for w in words):
        raise UsageError(f"--restart-on-exit-codes {text!r}: give exit codes separated by commas, e.g. 1,137")
    return [int(w) for w in words]


def parse_ranks(text: str | None) -> set[int] | None:
    """``--rank``: "3", "0,2" or "4-7" (None: every rank)."""
    if text is None:
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"--rank {text!r}: not a rank, a list or a range", hint="e.g. --rank 0, --rank 0,3 or "
                                                                                     "--rank 4-7")
        ranks.update(range(int(lo), int(hi if sep else lo) + 1))
    return ranks


@dataclass(frozen=True)
class LogsRequest:
    """One `clustertool logs [JOB]`: its lines so far (``follow``: until it ends), only ``node``'s ranks,
    ``ranks`` ("3", "0,2", "4-7"), the last ``tail`` lines of each stream, or one ``attempt`` (1: the first).
    ``job`` None: the latest job."""

    job: str | None = None
    follow: bool = False
    node: str | None = None
    ranks: str | None = None
    tail: int | None = None
    attempt: int | None = None

    def __post_init__(self) -> None:
        parse_ranks(self.ranks)
        if self.tail is not None and self.tail < 0:
            raise UsageError(f"--tail {self.tail}: give 0 or more lines", hint="e.g. --tail 50")
        if self.attempt is not None and self.follow:
            raise UsageError("--attempt shows one attempt as it is: leave out -f (which follows every attempt)")

    @property
    def rank_set(self) -> set[int] | None:
        return parse_ranks(self.ranks)


@dataclass(frozen=True)
class KillRequest:
    """One `clustertool kill [JOB]`: ``signal`` first, KILL after ``grace`` seconds, every process of the
    job checked gone; ``all_python``: the blunt fallback, ``pkill -9 python`` on ``nodes`` (default: all)."""

    job: str | None = None  # default: the one running job
    signal: str = "TERM"
    grace: float = 10.0
    all_python: bool = False
    nodes: str | None = None  # with all_python: where (a job is stopped on every node it ran on)

    def __post_init__(self) -> None:
        if self.grace < 0:
            raise UsageError(f"--grace {self.grace:g}: give 0 or more seconds", hint="e.g. --grace 10 (TERM, then KILL "
                                                                                     "10 s later)")


@dataclass(frozen=True)
class StacksRequest:
    """One `clustertool stacks [JOB]`: every rank's Python stack; ``py_spy``: py-spy's path on the nodes
    (None: found there; False: /proc only), ``timeout`` seconds for one rank's py-spy."""

    job: str | None = None  # default: the one running job
    py_spy: str | bool | None = None
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.py_spy is True:
            object.__setattr__(self, "py_spy", None)
        if self.timeout <= 0:
            raise UsageError(f"--timeout {self.timeout:g}: give seconds above 0", hint="e.g. --timeout 10")


@dataclass(frozen=True)
class RecoverRequest:
    """One `clustertool recover [JOB]`: the recovery loop for jobs run with --replace-failed (``job``: that
    one, until it ends), ``copy``: paths put back on each new node, asking the leader every ``poll`` seconds."""

    job: str | None = None
    copy: tuple[str, ...] = ()
    poll: float = 2.0

    def __post_init__(self) -> None:
        if self.poll <= 0:
            raise UsageError(f"--poll {self.poll:g}: give seconds above 0", hint="e.g. --poll 2")
        if any(not p.strip() for p in self.copy):
            raise UsageError("--copy: an empty path", hint="e.g. --copy data/train (a path on the leader)")
