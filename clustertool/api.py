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
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

import clustertool.cluster.cordon
import clustertool.cluster.status
import clustertool.jobs.kill
import clustertool.jobs.recovery
import clustertool.jobs.stacks
import clustertool.transfer.copy
import clustertool.transfer.s3
from clustertool.bench.allreducerun import AllreduceResult, run_allreduce
from clustertool.bench.benchrequests import AllreduceBenchRequest
from clustertool.cluster import lifecycle
from clustertool.cluster.autostop import AutostopReport, configure
from clustertool.cluster.clusterrequests import DownRequest, ReplaceRequest, UpRequest
from clustertool.cluster.cordon import CordonResult
from clustertool.cluster.spec import ClusterSpec, load_spec
from clustertool.cluster.status import ClusterStatus
from clustertool.core import nodeset, state
from clustertool.core.errors import RemoteError, UsageError
from clustertool.core.model import GroupResult, JobRecord, Reporter, silent
from clustertool.doctor import checkup
from clustertool.doctor.bisect import DEFAULT_THRESHOLD
from clustertool.doctor.doctorrequests import DoctorRequest
from clustertool.doctor.findings import Diagnosis
from clustertool.jobs import launch, records
from clustertool.jobs.follow import follow
from clustertool.jobs.jobrequests import (
    KillRequest,
    LogsRequest,
    RecoverRequest,
    RunRequest,
    StacksRequest,
    parse_ranks,
)
from clustertool.jobs.kill import KillResult
from clustertool.jobs.launch import Launch
from clustertool.jobs.logs import find_job, show
from clustertool.jobs.recovery import RecoverResult
from clustertool.jobs.stacks import StacksResult
from clustertool.remote import fabricgroup
from clustertool.remote.execute import execute
from clustertool.remote.remoterequests import ExecRequest
from clustertool.transfer.refill import Refilled, replace_and_refill
from clustertool.transfer.results import CopyResult, ProgressCb
from clustertool.transfer.s3 import SyncResult
from clustertool.transfer.transferrequests import CopyRequest, SyncS3Request
from clustertool.watch.verbs import ClusterWatch, JobWatch

LineFn = Callable[[str], None]
SpecSource = Union[str, "os.PathLike[str]", Mapping[str, Any], ClusterSpec, None]  # a spec file, its keys, a spec


R = TypeVar("R")


def _request(kind: type[R], given: object, options: dict[str, Any]) -> R:
    """A whole request as given (keywords beside it are refused)."""
    if not isinstance(given, kind):
        raise UsageError(f"give a {kind.__name__} or the arguments that make one")
    if options:
        raise UsageError(f"give a {kind.__name__} or keywords, not both")
    return given


def _run_request(command: str | Sequence[str] | RunRequest, options: dict[str, Any]) -> RunRequest:
    if not isinstance(command, RunRequest):
        return RunRequest.of(command, **options)
    return _request(RunRequest, command, options)


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


class Cluster(ClusterWatch):
    """A cluster this machine knows: the session every command makes (``record``: its state record,
    ``transport``: how its nodes are reached, ``report``: where progress lines go), with the verbs.
    ``Cluster(record, transport=ScriptedTransport())`` runs the same code over a test transport.  The watch verbs
    (``top``, ``watch``, ``monitoring``, ``metrics_query``, ``stragglers``) come from watch/verbs.py."""

    # ---- making and finding clusters -------------------------------------------------

    @staticmethod
    def _spec(spec: SpecSource, keywords: dict[str, Any]) -> ClusterSpec:
        if isinstance(spec, ClusterSpec):
            if keywords:
                raise UsageError("give a ClusterSpec or keywords, not both")
            return spec
        if spec is None or isinstance(spec, Mapping):
            return load_spec(None, {**dict(spec or {}), **keywords})
        return load_spec(os.fspath(spec), keywords)

    @classmethod
    def up(cls, spec: SpecSource = None, *, no_ssh: bool = False, report: Reporter = silent,
           controller: bool = False, controller_node: str | None = None, **keywords: Any) -> "Cluster":
        """Bring a cluster up, like `clustertool up`: a spec file's path, a dict of its keys, or keywords
        (``provider="local", nodes=4, name="demo", link_rate="200mbit"``; keywords win over the file).
        ``shared_fs=["local"]`` (or ``["efs", "fsx:fs-...@/data"]``, ``shared_mount="/shared"``): filesystems
        every node mounts, as `up --shared-fs`.  ``monitoring=True`` (or ``{"scrape_interval": "5s"}``): Prometheus
        on the cluster once it is up, as `up --monitoring`.  ``controller=True``: the recovery controller, as `up
        --controller` (``controller_node="node-2"``: `--controller-node`)."""
        result = lifecycle.up(UpRequest(cls._spec(spec, keywords), no_ssh=no_ssh, controller=controller,
                                        controller_node=controller_node), report=report)
        assert result.cluster is not None  # only a dry run has none
        return cls(result.cluster, report=report)

    @classmethod
    def plan(cls, spec: SpecSource = None, **keywords: Any) -> list[str]:
        """What `up` would make (`up --dry-run`), creating nothing."""
        return lifecycle.up(UpRequest(cls._spec(spec, keywords), dry_run=True)).plan

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
        return clustertool.cluster.cordon.cordon(self, _selection(nodes), reason=reason)

    def replace(self, nodes: str | Sequence[str] | ReplaceRequest, *, keep_old: bool = False,
                copy: Sequence[str] = ()) -> Refilled:
        """New machines for dead or bad nodes (`replace`): same name, role, slots and place in the
        hostfiles (local: the same address too); new host keys pinned everywhere; what was on the old
        disks is gone.  ``copy``: paths then copied from the leader to the same path on the new nodes,
        through the relay, verified (`replace --copy`; ``result.copied``).  Local and AWS providers;
        ``keep_old`` (AWS): the old instance is stopped and kept, tagged as replaced, until `down`.  Or a
        whole ``ReplaceRequest``."""
        request = nodes if isinstance(nodes, ReplaceRequest) else ReplaceRequest(
            _selection(nodes), copy=tuple(copy), keep_old=keep_old)
        return replace_and_refill(self, request)

    def uncordon(self, nodes: str | Sequence[str]) -> CordonResult:
        """Put cordoned nodes back (`uncordon`)."""
        return clustertool.cluster.cordon.uncordon(self, _selection(nodes))

    def doctor(self, checks: str | Sequence[str] | DoctorRequest | None = None, *, skip: str | Sequence[str] = (),
               **options: Any) -> Diagnosis:
        """`doctor`: ``checks`` ("network", "disk,clock" or a list; default all) minus ``skip``, or a whole
        ``DoctorRequest``; a ``Diagnosis`` (``.checks``, ``.findings``, ``.clean``; each finding's severity,
        node, message, fix).  Keywords (DoctorRequest.of, as the flags): ``fix``, ``cordon`` (every node found
        at error severity cordoned: ``.cordoned``), ``plugin_path``, ``disk_paths``, ``threshold``,
        ``all_pairs`` (the network check's), ``deep`` (DCGM diag level, 0 none), ``since``, ``gpu_timeout``,
        ``deep_timeout`` (the gpu check's), ``nccl_log`` (the efa check's), ``bisect``."""
        if isinstance(checks, DoctorRequest):
            request = _request(DoctorRequest, checks, dict(options, skip=skip) if skip else options)
        else:
            request = DoctorRequest.of(_names(checks), _names(skip), **options)
        return checkup.run(self, request)

    def bisect(self, *, threshold: float = DEFAULT_THRESHOLD, all_pairs: bool = False) -> Diagnosis:
        """`doctor --bisect`: the slow node or link in about ceil(log2(n)) + 1 rounds of pairs; the
        ``network`` check's ``data`` holds every measurement (round, pair, bits/s, round trip)."""
        return self.doctor(bisect=True, threshold=threshold, all_pairs=all_pairs)

    def bench_allreduce(self, request: AllreduceBenchRequest | None = None, *,
                        on_line: Callable[[str, str, str], None] | None = None, **options: Any) -> AllreduceResult:
        """`bench allreduce`: collnet_bench on every worker, one rank per node (the plugin deployed first,
        `plugin deploy`).  Keywords (AllreduceBenchRequest.of, as the flags): ``sizes`` ("1M:256M"), ``algo``
        ("servers,sharded,ring,mpi" or a list), ``dtype``, ``op``, ``iters``, ``warmup``, ``ifname``, ``env``,
        ``timeout``, ``tuner_csv`` (a tuner table written from the rows), ``request_size`` ("256K") and
        ``depth`` (8): NCCL's request stream, or ``one_request=True``; or a whole request.  The result's
        ``rows`` (all_reduce_perf's columns), ``ok``, ``failure`` (why a run failed), ``wrong`` (a row that
        differs from MPI_Allreduce), ``link_line``; ``to_dict()`` is its --json.  ``on_line(node, "stdout",
        line)`` sees collnet_bench's output as it comes."""
        if request is None:
            request = AllreduceBenchRequest.of(**options)
        elif options:
            raise UsageError("give an AllreduceBenchRequest or keywords, not both")
        return run_allreduce(self, request, on_line=on_line)

    # ---- commands, data, jobs --------------------------------------------------------------

    def exec(self, command: str | Sequence[str], *, nodes: str | None = None, timeout: float | None = None,
             on_line: Callable[[str, str, str], None] | None = None, check: bool = False) -> GroupResult:
        """Run on the selected nodes at once (`exec`): one string is a shell line, a list is quoted word
        by word.  ``on_line(node, "stdout"|"stderr", line)`` sees output as it comes.  ``check``: raise
        RemoteError when a node failed (else failures are values: ``result.failed()``)."""
        result = execute(self, ExecRequest.of(command, nodes=nodes, timeout=timeout), on_line=on_line)
        if check and not result.ok:
            bad = result.failed()
            raise RemoteError(f"{len(bad)} node(s) failed: " + "; ".join(f"{r.node}: {r.reason}" for r in bad),
                              exit_code=result.exit_code)
        return result

    def copy(self, src: str | CopyRequest, dest: str | None = None, *, on_progress: ProgressCb | None = None,
             **options: Any) -> CopyResult:
        """SRC onto DEST of the selected nodes (`copy`): from the leader, or with ``source="local"`` from
        here; incremental, verified by hash.  Keywords (CopyRequest's fields, as the flags): ``source``,
        ``nodes``, ``strategy`` (auto, chain, fanout), ``verify``, ``verify_only`` (copy nothing, compare),
        ``delete``, ``cipher``; or a whole ``CopyRequest``.  Check ``result.exit_code`` (0: every node matches)."""
        request = CopyRequest(src, dest, **options) if isinstance(src, str) and dest is not None else _request(
            CopyRequest, src, options)
        return clustertool.transfer.copy.copy(self, request, on_progress=on_progress)

    def sync_s3(self, url: str | SyncS3Request, dest: str | None = None, *, on_progress: ProgressCb | None = None,
                **options: Any) -> SyncResult:
        """Every selected node pulls s3://BUCKET/PREFIX into DEST at once (`sync-s3`): this machine lists the
        prefix with your AWS credentials and hands each node presigned URLs (no credentials reach a node).
        Keywords (SyncS3Request's fields): ``nodes``, ``shard``, ``endpoint_url``, ``region``, ``threads``,
        ``url_expiry`` (seconds), ``recheck``, ``timeout``; or a whole ``SyncS3Request``."""
        request = SyncS3Request(url, dest, **options) if isinstance(url, str) and dest is not None else _request(
            SyncS3Request, url, options)
        return clustertool.transfer.s3.sync_s3(self, request, on_progress=on_progress)

    def run(self, command: str | Sequence[str] | RunRequest, *, on_progress: ProgressCb | None = None,
            **options: Any) -> "Job":
        """Start a job on the leader, detached (`run`): ``command`` one string (a shell line) or a list of
        words, with the options as keywords, or a whole ``RunRequest``.  The keywords (RunRequest.of) are
        run's flags: ``nodes``, ``np``, ``per_node``, ``env`` (``{"A": 1}`` or ``["A=1", "B"]``), ``sync`` (a
        local folder, ``True``: this one, sent first to the same path on the job's nodes, where the job then
        runs), ``sync_to``, ``workdir``, ``name``, ``plugin``, ``nccl_debug``, ``mpi_args``, ``oversubscribe``,
        ``allow_concurrent``, ``tag_output``, ``launcher`` (mpirun, torchrun, accelerate, deepspeed or process;
        None: mpirun, or the launcher the command starts with), ``hang_timeout`` (seconds: save every rank's
        stack and mark the job hung when nothing moved that long; ``hang_action="kill"`` stops it too),
        ``restarts`` (start the same command again, same job id, ``CLUSTERTOOL_RESTART_COUNT`` 1, 2 ... in
        every rank, when it fails), ``restart_on_exit_codes`` (only for these: the first failing rank's code,
        128+signal for a signal), ``replace_failed`` (a lost node is replaced first: the leader waits up to
        ``replace_wait`` seconds for ``Cluster.recover`` or ``Job.follow(recover=True)``, which run here,
        where the credentials are), ``on_preempt_signal`` (what ranks get on a spot notice, default TERM),
        ``fusion_mb``, ``cycle_ms``, ``timeline``, ``autotune`` (the --horovod-* flags).  A bad value raises
        UsageError naming the flag.  ``on_progress(node, done, total)``: the sync's bytes."""
        started = launch.run(self, _run_request(command, options), on_progress=on_progress)
        return Job(self, started.job, synced=started.synced)

    def plan_run(self, command: str | Sequence[str] | RunRequest, **options: Any) -> Launch:
        """What `run --dry-run` shows, starting nothing: ``.argv`` (mpirun's), ``.job`` (nodes, ranks,
        launcher), ``.node_commands`` (a node launcher's); ``to_dict()`` is its --json.  Arguments as ``run``."""
        return launch.run(self, _run_request(command, options), dry_run=True)

    def recover(self, job: str | None = None, *, copy: Sequence[str] = (), poll: float = 2.0,
                stop: threading.Event | None = None) -> RecoverResult:
        """The recovery loop (`recover`): replace the nodes that jobs run with ``replace_failed`` lost, let
        them go on; until ``job`` (default: every such running job) ended, or ``stop`` is set.  ``copy``:
        paths copied from the leader to each new node."""
        return clustertool.jobs.recovery.recover(self, RecoverRequest(job, copy=tuple(copy), poll=poll), stop=stop)

    def jobs(self) -> list["Job"]:
        """The cluster's jobs, oldest first, with their state as the leader sees it now (`jobs`)."""
        return [Job(self, j) for j in records.refresh(self)]

    def job(self, ref: str) -> "Job":
        """A job by id, unique id prefix or name."""
        return Job(self, find_job(self, ref)[1])

    def kill(self, job: str | None = None, *, signal: str = "TERM", grace: float = 10.0, all_python: bool = False,
             nodes: str | None = None) -> KillResult:
        """`kill`: stop a job's processes on every node and verify (``job``: id, prefix or name; None: the one
        running job); ``all_python``: the blunt fallback, ``pkill -9 python`` on ``nodes`` (default: all)."""
        return clustertool.jobs.kill.run(self, KillRequest(job, signal=signal, grace=grace, all_python=all_python,
                                                           nodes=nodes))

    def stacks(self, job_id: str | None = None, *, py_spy: str | bool | None = None,
               timeout: float = 10.0) -> StacksResult:
        """Every rank's Python stack of a running job, identical stacks folded (`stacks`): ``.groups``
        (biggest first; ``label``, ``summary``), ``.ranks`` (threads, frames, the method used),
        ``.problems``; ``to_dict()`` is its --json.  ``py_spy=False``: /proc only."""
        return clustertool.jobs.stacks.stacks(self, StacksRequest(job_id, py_spy=py_spy, timeout=timeout))

    def fabric(self, nodes: str | None = None) -> Any:
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
        return lifecycle.down(self, DownRequest(terminate_adopted=terminate_adopted, keep_shared_fs=keep_shared_fs))

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        if state.exists(self.name):
            self.down()

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.record.provider}, {len(self.record.nodes)} nodes, {self.record.status})"


class Job(JobWatch):
    """One `run` job; ``record`` is its record (``core.model.JobRecord``), as of the last look at the leader;
    ``report`` and ``stragglers`` come from watch/verbs.py."""

    cluster: Cluster

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
        request = LogsRequest(self.id, node=node, ranks=_ranks(rank), tail=tail, attempt=attempt)
        show(self.cluster, request, lines.append)
        return lines

    def follow(self, on_line: LineFn = print, *, rank: int | str | Iterable[int] | None = None,
               node: str | None = None, recover: bool = False) -> int | None:
        """Hand each line to ``on_line`` as it completes until the job ends (`logs -f`); its exit code.
        ``recover``: a job run with ``replace_failed`` gets its recovery loop here, beside the stream, as
        `run --follow` does: a lost node is replaced and the job goes on (a lost leader too: the job starts
        again on the new one and is followed there); progress lines and what stopped the loop go to the
        cluster's ``report``."""
        if recover:
            if node is not None:
                self.cluster.record.node(node)  # an unknown node is a clear error
            code = follow(self.cluster, self.record, on_line, recover=True, ranks=parse_ranks(_ranks(rank)),
                          node=node)
        else:
            code = show(self.cluster, LogsRequest(self.id, follow=True, node=node, ranks=_ranks(rank)), on_line)
        self.refresh()
        return code

    def kill(self, signal: str = "TERM", *, grace: float = 10.0) -> KillResult:
        """Stop the job's processes on every node and verify (`kill`); ``result.clean`` says all is gone."""
        result = clustertool.jobs.kill.run(self.cluster, KillRequest(self.id, signal=signal, grace=grace))
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
