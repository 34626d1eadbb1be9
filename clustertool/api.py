"""The Python API: clusters, commands, copies and jobs from a script, through the core the CLI calls.

    from clustertool import Cluster

    with Cluster.up(provider="local", nodes=4, name="demo") as cluster:   # down when the block ends
        print(cluster.exec("hostname").by_node()["node-2"].stdout)
        job = cluster.run("python3 train.py", sync=".")                   # --sync: this folder first
        job.wait()
        print("\\n".join(job.logs()))

Every method calls the same core function as the matching command (``up`` -> lifecycle.up,
``exec`` -> remote.execute.execute, ``copy`` -> transfer.copy.copy, ``run`` -> jobs.launch.run ...)
and returns its result objects, whose ``to_dict()`` is what the command prints with ``--json``.
Failures raise clustertool.core.errors (``ToolError`` and its kinds: ``.message``, ``.hint``); a node that
failed a command is a value in the result (``HostResult.reason``), not an exception, unless
``check=True``.  Progress lines go to ``report`` (a callable taking one str) when one is given;
by default the API prints nothing.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterable, Mapping, Sequence

import clustertool.cluster.cordon
import clustertool.cluster.replace
import clustertool.cluster.status
import clustertool.jobs.kill
import clustertool.jobs.recovery
import clustertool.jobs.stacks
import clustertool.transfer.copy
from clustertool.cluster import lifecycle
from clustertool.cluster.autostop import AutostopReport, configure
from clustertool.cluster.cordon import CordonResult
from clustertool.cluster.replace import ReplaceResult
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.spec import ClusterSpec, load_spec
from clustertool.cluster.status import ClusterStatus
from clustertool.core import nodeset, state
from clustertool.core.errors import RemoteError, UsageError
from clustertool.core.model import GroupResult, JobRecord, Reporter, silent
from clustertool.doctor import checkup
from clustertool.doctor.bisect import DEFAULT_THRESHOLD
from clustertool.doctor.findings import Diagnosis
from clustertool.jobs import launch, records
from clustertool.jobs.kill import KillResult
from clustertool.jobs.logs import find_job, show
from clustertool.jobs.mpirun import MpiOptions
from clustertool.jobs.recovery import RecoverResult
from clustertool.jobs.stacks import StacksResult
from clustertool.remote import fabricgroup
from clustertool.remote.execute import execute
from clustertool.transfer.chain import DEFAULT_CIPHER
from clustertool.transfer.results import CopyResult, ProgressCb

LineFn = Callable[[str], None]


def _words(command: str | Sequence[str]) -> list[str]:
    """A command as the CLI gets it: one string is a shell line, a list is quoted word by word."""
    if isinstance(command, str):
        return [command]
    words = [str(w) for w in command]
    if not words:
        raise UsageError("no command given")
    return words


def _env(env: Mapping[str, object] | Iterable[str] | None) -> list[str]:
    """``{"A": 1}`` or ``["A=1", "B"]`` (B: the leader's value) as run's -x items."""
    if env is None:
        return []
    if isinstance(env, Mapping):
        return [f"{k}={v}" for k, v in env.items()]
    return [str(item) for item in env]


def _selection(nodes: str | Sequence[str]) -> str:
    """A node selection from one string or a list of names / patterns."""
    text = nodes if isinstance(nodes, str) else ",".join(str(n) for n in nodes)
    if not text:
        raise UsageError("no node given", hint='e.g. cluster.cordon("node-3", reason="Xid 79")')
    return text


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _ranks(rank: int | str | Iterable[int] | None) -> str | None:
    if rank is None or isinstance(rank, str):
        return rank
    if isinstance(rank, int):
        return str(rank)
    return ",".join(str(int(r)) for r in rank)


class Cluster(ClusterSession):
    """A cluster this machine knows: the session every command makes (``record``: its state record,
    ``transport``: how its nodes are reached, ``report``: where progress lines go), with the verbs.
    ``Cluster(record, transport=ScriptedTransport())`` runs the same code over a test transport."""

    # ---- making and finding clusters -------------------------------------------------

    @staticmethod
    def _spec(spec, keywords: dict) -> ClusterSpec:
        if isinstance(spec, ClusterSpec):
            if keywords:
                raise UsageError("give a ClusterSpec or keywords, not both")
            return spec
        if spec is None or isinstance(spec, Mapping):
            return load_spec(None, {**dict(spec or {}), **keywords})
        return load_spec(os.fspath(spec), keywords)

    @classmethod
    def up(cls, spec: str | os.PathLike | Mapping | ClusterSpec | None = None, *, no_ssh: bool = False,
           report: Reporter = silent, **keywords) -> "Cluster":
        """Bring a cluster up, like `clustertool up`: a spec file's path, a dict of its keys, or keywords
        (``provider="local", nodes=4, name="demo", link_rate="200mbit"``; keywords win over the file).
        ``shared_fs=["local"]`` (or ``["efs", "fsx:fs-...@/data"]``, ``shared_mount="/shared"``): filesystems
        every node mounts, as `up --shared-fs`."""
        result = lifecycle.up(cls._spec(spec, keywords), no_ssh=no_ssh, report=report)
        assert result.cluster is not None  # only a dry run has none
        return cls(result.cluster, report=report)

    @classmethod
    def plan(cls, spec: str | os.PathLike | Mapping | ClusterSpec | None = None, **keywords) -> list[str]:
        """What `up` would make (`up --dry-run`), creating nothing."""
        return lifecycle.up(cls._spec(spec, keywords), dry_run=True).plan

    @classmethod
    def names(cls) -> list[str]:
        """The clusters this machine knows (`clustertool ls`)."""
        return state.list_clusters()

    # ---- what it is ----------------------------------------------------------------------

    @property
    def hostfile(self) -> str | None:
        return self.record.hostfile_path

    def refresh(self) -> "Cluster":
        """Re-read the state record (after another process changed the cluster)."""
        self.reload()
        return self

    def status(self, *, check_ssh: bool = True) -> ClusterStatus:
        """Nodes with role, address, slots, state and reachability (`status`; ``to_dict()`` is its --json)."""
        result = clustertool.cluster.status.status(self, check_ssh=check_ssh)
        self.record = result.cluster
        return result

    def cordon(self, nodes: str | Sequence[str], *, reason: str | None = None) -> CordonResult:
        """Keep nodes out of the hostfiles and every job's default nodes (`cordon`); ``nodes``: "node-5",
        "node-[3-4]" or a list of names.  The leader cannot be cordoned (UsageError)."""
        return clustertool.cluster.cordon.cordon(self, _selection(nodes), reason=reason, report=self.report)

    def replace(self, nodes: str | Sequence[str], *, keep_old: bool = False) -> ReplaceResult:
        """New machines for dead or bad nodes (`replace`): same name, role, slots and place in the
        hostfiles (local: the same address too); new host keys pinned everywhere; what was on the old
        disks is gone.  Local and AWS providers; ``keep_old`` (AWS): the old instance is stopped and
        kept, tagged as replaced, until `down`."""
        return clustertool.cluster.replace.replace(self, _selection(nodes), keep_old=keep_old, report=self.report)

    def uncordon(self, nodes: str | Sequence[str]) -> CordonResult:
        """Put cordoned nodes back (`uncordon`)."""
        return clustertool.cluster.cordon.uncordon(self, _selection(nodes), report=self.report)

    def doctor(self, checks: str | Sequence[str] | None = None, *, skip: str | Sequence[str] = (), fix: bool = False,
               threshold: float = DEFAULT_THRESHOLD, all_pairs: bool = False, deep: int = 0,
               since: str | None = None, gpu_timeout: float = 60.0, deep_timeout: float = 600.0,
               nccl_log: str | None = None) -> Diagnosis:
        """`doctor`: ``checks`` ("network", "disk,clock" or a list; default all) minus ``skip``; a
        ``Diagnosis`` (``.checks``, ``.findings``, ``.clean``; each finding's severity, node, message, fix).
        ``threshold``, ``all_pairs``: the network check's, as `--threshold`, `--all-pairs`; ``deep`` (DCGM
        diag level, 0 none), ``since``, ``gpu_timeout``, ``deep_timeout``: the gpu check's, as `--deep-level`,
        `--since`, `--gpu-timeout`, `--deep-timeout`; ``nccl_log``: the efa check's, as `--nccl-log`."""
        chosen = checkup.choose_checks(_names(checks), _names(skip))
        return checkup.run(self, fix=fix, checks=chosen, threshold=threshold, all_pairs=all_pairs,
                                      report=self.report, deep=deep, since=since, gpu_timeout=gpu_timeout,
                                      deep_timeout=deep_timeout, nccl_log=nccl_log)

    def bisect(self, *, threshold: float = DEFAULT_THRESHOLD, all_pairs: bool = False) -> Diagnosis:
        """`doctor --bisect`: the slow node or link in about ceil(log2(n)) + 1 rounds of pairs; the
        ``network`` check's ``data`` holds every measurement (round, pair, bits/s, round trip)."""
        return checkup.bisect(self, threshold=threshold, all_pairs=all_pairs, report=self.report)

    # ---- commands, data, jobs --------------------------------------------------------------

    def exec(self, command: str | Sequence[str], *, nodes: str | None = None, timeout: float | None = None,
             on_line: Callable[[str, str, str], None] | None = None, check: bool = False) -> GroupResult:
        """Run on the selected nodes at once (`exec`): one string is a shell line, a list is quoted word
        by word.  ``on_line(node, "stdout"|"stderr", line)`` sees output as it comes.  ``check``: raise
        RemoteError when a node failed (else failures are values: ``result.failed()``)."""
        result = execute(self, nodes, _words(command), timeout=timeout, on_line=on_line)
        if check and not result.ok:
            bad = result.failed()
            raise RemoteError(f"{len(bad)} node(s) failed: " + "; ".join(f"{r.node}: {r.reason}" for r in bad),
                              exit_code=result.exit_code)
        return result

    def copy(self, src: str, dest: str, *, source: str = "leader", nodes: str | None = None,
             strategy: str = "auto", verify: bool = True, delete: bool = False, cipher: str | None = DEFAULT_CIPHER,
             on_progress: ProgressCb | None = None) -> CopyResult:
        """SRC onto DEST of the selected nodes (`copy`): from the leader, or with ``source="local"`` from
        here; incremental, verified by hash.  Check ``result.exit_code`` (0: every node matches)."""
        return clustertool.transfer.copy.copy(self, src, dest, source=source, selection=nodes, strategy=strategy,
                         verify_after=verify, delete=delete, cipher=cipher, on_progress=on_progress,
                         report=self.report)

    def run(self, command: str | Sequence[str], *, nodes: str | None = None, np: int | None = None,
            per_node: int | None = None, env: Mapping[str, object] | Iterable[str] | None = None,
            sync: str | os.PathLike | bool | None = None, sync_to: str | None = None, workdir: str | None = None,
            name: str | None = None, plugin: bool = False, nccl_debug: str | None = None,
            mpi_args: Sequence[str] = (), oversubscribe: bool = False, allow_concurrent: bool = False,
            tag_output: bool = True, launcher: str | None = None, hang_timeout: float | None = None,
            hang_action: str = "keep", restarts: int = 0, restart_on_exit_codes: Iterable[int] | None = None,
            replace_failed: bool = False, replace_wait: float | None = None, on_preempt_signal: str | None = None,
            on_progress: ProgressCb | None = None, **horovod) -> "Job":
        """Start a job on the leader, detached (`run`).  ``launcher``: mpirun, torchrun, accelerate, deepspeed
        or process (None: mpirun, or the launcher the command starts with).  ``hang_timeout`` (seconds):
        save every rank's stack and mark the job hung when nothing moved that long (``hang_action`` "kill":
        stop it too).  ``restarts``: start the same command again (same job id, ``CLUSTERTOOL_RESTART_COUNT``
        1, 2 ... in every rank) when it fails, up to that many times; ``restart_on_exit_codes``: only for these
        codes (the first failing rank's, 128+signal for a signal).  ``replace_failed``: a lost node is
        replaced first (the leader waits up to ``replace_wait`` seconds for ``Cluster.recover``, which runs here,
        where the credentials are); ``on_preempt_signal``: what ranks get on a spot notice (default TERM).
        ``sync``: a local folder (``True``: the
        current one) sent first to the same path on the job's nodes, where the job then runs.
        ``horovod``: fusion_mb, cycle_ms, timeline, autotune (run's --horovod-* flags)."""
        unknown = set(horovod) - {"fusion_mb", "cycle_ms", "timeline", "autotune"}
        if unknown:
            raise UsageError(f"run() got unknown keyword(s): {', '.join(sorted(unknown))}")
        opts = MpiOptions(command=_words(command), np=np, per_node=per_node, env=_env(env), mpi_args=list(mpi_args),
                          horovod_fusion_mb=horovod.get("fusion_mb"), horovod_cycle_ms=horovod.get("cycle_ms"),
                          horovod_timeline=horovod.get("timeline"), horovod_autotune=bool(horovod.get("autotune")),
                          nccl_debug=nccl_debug, workdir=workdir, oversubscribe=oversubscribe, tag_output=tag_output,
                          launcher=launcher)
        folder = None if sync is None or sync is False else ("." if sync is True else os.fspath(sync))
        started = launch.run(self, opts, selection=nodes, name=name, allow_concurrent=allow_concurrent,
                             use_plugin=plugin, sync=folder, sync_to=sync_to, on_progress=on_progress,
                             hang_timeout=hang_timeout, hang_action=hang_action, restarts=restarts,
                             restart_on_exit_codes=None if restart_on_exit_codes is None else [
                                 int(c) for c in restart_on_exit_codes], replace_failed=replace_failed,
                             replace_wait=replace_wait, on_preempt_signal=on_preempt_signal, report=self.report)
        return Job(self, started.job, synced=started.synced)

    def recover(self, job: str | None = None, *, copy: Sequence[str] = (), poll: float = 2.0,
                stop: threading.Event | None = None) -> RecoverResult:
        """The recovery loop (`recover`): replace the nodes that jobs run with ``replace_failed`` lost, let
        them go on; until ``job`` (default: every such running job) ended, or ``stop`` is set.  ``copy``:
        paths copied from the leader to each new node."""
        return clustertool.jobs.recovery.recover(self, job, copy=copy, poll=poll, stop=stop, report=self.report)

    def jobs(self) -> list["Job"]:
        """The cluster's jobs, oldest first, with their state as the leader sees it now (`jobs`)."""
        return [Job(self, j) for j in records.refresh(self)]

    def job(self, ref: str) -> "Job":
        """A job by id, unique id prefix or name."""
        return Job(self, find_job(self, ref)[1])

    def stacks(self, job_id: str | None = None, *, py_spy: str | bool | None = None,
               timeout: float = 10.0) -> StacksResult:
        """Every rank's Python stack of a running job, identical stacks folded (`stacks`): ``.groups``
        (biggest first; ``label``, ``summary``), ``.ranks`` (threads, frames, the method used),
        ``.problems``; ``to_dict()`` is its --json.  ``py_spy=False``: /proc only."""
        return clustertool.jobs.stacks.stacks(self, job_id, py_spy=py_spy, timeout=timeout)

    def fabric(self, nodes: str | None = None):
        """A ``fabric.ThreadingGroup`` of the selected nodes (leader first) that trusts only the pinned
        host keys (paramiko's RejectPolicy) and offers only the cluster key."""
        self.reload()
        cluster = self.ready()
        return fabricgroup.thread_group(cluster, nodeset.select(cluster, nodes))

    def autostop(self, idle: str | None = None, *, down: bool = False, wait_for: str | None = None,
                 cancel: bool = False) -> AutostopReport:
        """`clustertool autostop`: set (``idle="30m"``, ``down=True`` to terminate), ``cancel=True``, or
        (neither) read the setting and the leader's idle time; ``.to_dict()`` is what `--json` prints."""
        return configure(self, idle, down=down, wait_for=wait_for, cancel=cancel)

    def down(self, *, terminate_adopted: bool = False, keep_shared_fs: bool = False) -> list[str]:
        """Remove everything the cluster made (`down --yes`; ``keep_shared_fs``: `--keep-shared-fs`); what was
        removed, line by line."""
        return lifecycle.down(self.name, report=self.report, terminate_adopted=terminate_adopted,
                              keep_shared_fs=keep_shared_fs)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        if state.exists(self.name):
            self.down()

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.record.provider}, {len(self.record.nodes)} nodes, {self.record.status})"


class Job:
    """One `run` job; ``record`` is its record (``core.model.JobRecord``), as of the last look at the leader."""

    def __init__(self, cluster: Cluster, record: JobRecord, *, synced: CopyResult | None = None):
        self.cluster = cluster
        self.record = record
        self.synced = synced  # what run(sync=...) sent (``bytes_sent``, per node ``files_sent``)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def state(self) -> str:
        """running, succeeded, failed, killed or lost (as of the last refresh, wait or kill)."""
        return self.record.state

    @property
    def exit_code(self) -> int | None:
        return self.record.exit_code

    @property
    def attempts(self) -> list[dict]:
        """A job run with ``restarts``: each attempt as ``{"attempt", "restart_count", "start", "end", "code",
        "cause"}`` (as of the last refresh or wait); ``record.restart_verdict`` says why the restarts stopped."""
        return list(self.record.attempts)

    def refresh(self) -> "Job":
        self.record = find_job(self.cluster, self.id)[1]
        return self

    def wait(self, timeout: float | None = None, *, poll: float = 2.0) -> int | None:
        """Wait until the job ends; its exit code (None: killed or lost without one).  A job still
        running after ``timeout`` seconds raises ToolError and keeps running."""
        self.record = launch.wait(self.cluster, self.id, timeout=timeout, poll=poll)
        return self.record.exit_code

    def logs(self, *, rank: int | str | Iterable[int] | None = None, node: str | None = None,
             tail: int | None = None, attempt: int | None = None) -> list[str]:
        """The job's output so far in whole lines, as `logs` prints them (``[1,R]<stdout>:text``); ``attempt``:
        a job run with ``restarts``, only that attempt's rank lines (1: the first)."""
        lines: list[str] = []
        show(self.cluster, self.id, lines.append, node=node, rank=_ranks(rank), lines=tail, attempt=attempt)
        return lines

    def follow(self, on_line: LineFn = print, *, rank: int | str | Iterable[int] | None = None,
               node: str | None = None) -> int | None:
        """Hand each line to ``on_line`` as it completes until the job ends (`logs -f`); its exit code."""
        code = show(self.cluster, self.id, on_line, follow_log=True, node=node, rank=_ranks(rank))
        self.refresh()
        return code

    def kill(self, signal: str = "TERM", *, grace: float = 10.0) -> KillResult:
        """Stop the job's processes on every node and verify (`kill`); ``result.clean`` says all is gone."""
        result = clustertool.jobs.kill.kill(self.cluster, self.id, signal=signal, grace=grace)
        if result.job is not None:
            self.record = result.job
        return result

    def stacks(self, *, py_spy: str | bool | None = None, timeout: float = 10.0) -> StacksResult:
        """Every rank's Python stack, identical stacks folded (`stacks`; see ``Cluster.stacks``)."""
        return self.cluster.stacks(self.id, py_spy=py_spy, timeout=timeout)

    def to_dict(self) -> dict:
        return self.record.to_dict()

    def __repr__(self) -> str:
        return f"Job({self.id!r}, {self.state}, exit {self.exit_code})"
