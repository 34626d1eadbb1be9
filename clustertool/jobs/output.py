"""A job's output in whole lines: every rank's files on their nodes, read or followed, merged.

A job started by `clustertool run` writes each rank's output to its own files on the rank's
node (``--output-filename OUT:nocopy``, see jobs/mpirun.py); mpirun's own messages go to the
job's ``log`` on the leader.  ``nodeprogs/ranklog.py`` runs on each node of the job and turns
those files into tagged lines, holding a partial last line until it is complete (or the job
ended), so lines from different ranks never run into each other.

* ``read``: what is there now, in rank order (each rank's stdout, then its stderr), then
  mpirun's own lines.
* ``follow``: lines as they complete, from every node at once, until the job ends; then the
  exit code.  The leader's follower knows when the job ended; the members' followers are told
  (a stop file each), read what is left and stop.

Jobs from before per-rank files (``Job.output_dir`` None) are read from the leader's log, whose
lines carry mpirun's ``--tag-output`` prefix (``legacy_*``).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import threading
import time
from typing import Callable, Iterable

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR
from clustertool.core.model import ClusterRecord, HostResult, JobRecord, Node
from clustertool.jobs import records, scripts
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.remote.transport import NodeProcess, Transport, stop_process

TAG_RE = re.compile(r"^\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
LineSink = Callable[[str], None]
Warn = Callable[[str], None]


def _ignore(_text: str) -> None:
    pass


def job_dir(job: JobRecord) -> str:
    """The job's folder (absolute, as on the leader) of a job with per-rank output."""
    assert job.output_dir is not None, f"job {job.id} has no per-rank output (logs.py reads its log)"
    return os.path.dirname(job.output_dir.rstrip("/"))


def node_args(job: JobRecord, *, mode: str, ranks: Iterable[int] | None = None, with_log: bool = False,
              tail: int | None = None, final: bool = False, end: dict | None = None,
              keys: bool = False, attempt: int | None = None) -> dict:
    """ARGS of nodeprogs/ranklog.py for one node."""
    return {"out": job.output_dir, "log": f"{job_dir(job)}/log" if with_log else None,
            "ranks": None if ranks is None else sorted(ranks), "tag": job.tag_output, "mode": mode,
            "tail": tail, "final": final, "end": end or {}, "keys": keys, "attempt": attempt}


def leader_end(job: JobRecord) -> dict:
    return {"job_dir": job_dir(job), "marker": f"{JOB_ENV}={job.id}"}


def pane_program(job: JobRecord) -> bytes:
    """pane.py: the leader's ranks and mpirun's lines, whole, in the job's tmux pane."""
    args = node_args(job, mode="follow", with_log=True, end=leader_end(job))
    return nodeprogs.program_text("ranklog", args)


def _job_nodes(cluster: ClusterRecord, job: JobRecord, node: str | None) -> list[Node]:
    names = [n for n in job.nodes if node is None or n == node]
    if node is not None and not names:
        raise UsageError(f"job {job.id} did not run on {node}", hint=f"its nodes: {', '.join(job.nodes)}")
    return [cluster.node(n) for n in names]


def _warn_failed(results: Iterable[HostResult], warn: Warn) -> None:
    for r in results:
        if not r.ok:
            warn(f"{r.node}: could not read its ranks' output: {r.reason}")


def read(session: ClusterSession, job: JobRecord, on_line: LineSink, *, ranks: set[int] | None = None,
         node: str | None = None, tail: int | None = None, warn: Warn = _ignore, attempt: int | None = None) -> None:
    """Every line there is now: rank by rank (stdout, then stderr), then mpirun's own lines.  A job run with
    --restarts: attempt by attempt, each after a separator line (``attempt``: only that one's rank lines)."""
    cluster = session.record
    nodes = _job_nodes(cluster, job, node)
    leader = cluster.node(job.leader)
    with_log = ranks is None and attempt is None
    if with_log and leader not in nodes:
        nodes.append(leader)

    def program(n: Node) -> bytes:
        own: Iterable[int] | None = ranks if (node is None or n.name == node) else []
        args = node_args(job, mode="read", ranks=own, with_log=with_log and n.name == job.leader, tail=tail,
                         final=job.finished, keys=True, attempt=attempt)
        return nodeprogs.program_text("ranklog", args)

    result = run_on_nodes(session, nodes, nodeprogs.python_command(), stdin_data=program, timeout=120)
    _warn_failed(result.results, warn)
    keyed, found = [], False
    for r in result.results:
        for line in r.stdout.splitlines():
            if line.startswith("found "):
                found = found or line != "found 0"
                continue
            parts = line.split(" ", 3)
            if len(parts) == 4 and all(p.lstrip("-").isdigit() for p in parts[:3]):
                keyed.append(((int(parts[0]), int(parts[1]), int(parts[2])), parts[3]))
    if not found and all(r.ok for r in result.results):
        raise ToolError(f"no output for job {job.id}: it was removed (`clustertool clean`)")
    shown = None
    for key, text in sorted(keyed, key=lambda kv: kv[0]):  # stable: each file's lines keep their order
        if len(job.attempts) > 1 and attempt is None and key[0] != shown and key[0] <= len(job.attempts):
            shown = key[0]
            on_line(attempt_separator(job, shown))
        on_line(text)


def attempt_separator(job: JobRecord, number: int) -> str:
    """The line before attempt ``number``'s lines (1: the first) of a job run with --restarts."""
    a = job.attempts[number - 1]
    how = "running" if a.get("end") is None else ("exit code 0" if a.get("code") == 0 else a.get("cause") or "?")
    return (f"clustertool: ---- attempt {number} of {len(job.attempts)} (CLUSTERTOOL_RESTART_COUNT={number - 1}): "
            f"{how} ----")


class _Recording(Transport):
    """The transport, keeping every process it starts (to end them if the client is interrupted)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.procs: list[NodeProcess] = []

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        return self.inner.argv(cluster_name, node, command, extra=extra)

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None) -> NodeProcess:
        proc = self.inner.spawn(cluster_name, node, command, stdin, extra=extra)
        self.procs.append(proc)
        return proc


def _stop_line(path: str) -> str:
    return f"mkdir -p {shlex.quote(os.path.dirname(path))} && touch {shlex.quote(path)}"


def follow_lines(session: ClusterSession, job: JobRecord, on_line: LineSink, *, ranks: set[int] | None = None,
                 node: str | None = None, tail: int | None = None, warn: Warn = _ignore) -> None:
    """Lines as they complete on every node of the job, until the job ends (Ctrl-C: stop following)."""
    cluster = session.record
    transport = session.transport
    selected = _job_nodes(cluster, job, node)
    if job.slurm and job.restarts and node is None:  # a requeue may run it on other nodes: follow every one
        selected = list(cluster.nodes)
    leader = cluster.node(job.leader)
    members = [n for n in selected if n.name != job.leader]
    stop = f"{job_dir(job)}/follow-{secrets.token_hex(6)}.stop"
    lock, closed = threading.Lock(), threading.Event()

    def emit(_node: str, stream: str, text: str) -> None:
        if stream == "stdout" and not closed.is_set():
            with lock:
                on_line(text)

    def program(n: Node) -> bytes:
        if n.name == job.leader:
            own: Iterable[int] | None = ranks if leader in selected else []
            args = node_args(job, mode="follow", ranks=own, with_log=ranks is None, tail=tail, end=leader_end(job))
        else:
            args = node_args(job, mode="follow", ranks=ranks, tail=tail, end={"stop": stop})
        return nodeprogs.program_text("ranklog", args)

    recording = _Recording(transport)
    member_results: list[HostResult] = []
    began, leader_done = time.time(), threading.Event()

    def follow_member(node: Node) -> None:
        pending: list[Node] = [node]
        record = cluster
        while pending:
            got = run_on_nodes(ClusterSession(record, recording), pending, nodeprogs.python_command(),
                               on_line=emit, stdin_data=program).results
            pending, record = _replaced_since(cluster.name, {r.node for r in got if not r.ok}, began, leader_done,
                                              job.replace_failed)
            member_results.extend(r for r in got if r.ok or r.node not in {n.name for n in pending})

    def follow_members() -> None:  # one thread per member: a lost one is followed again once replaced
        threads = [threading.Thread(target=follow_member, args=(n,), daemon=True) for n in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    thread = threading.Thread(target=follow_members, daemon=True)
    if members:
        thread.start()
    try:
        lead = run_on_node(session, leader, nodeprogs.python_command(), on_line=emit,
                           stdin_data=program(leader))
        _warn_failed([lead], warn)
    finally:
        leader_done.set()
        if members:
            run_on_nodes(session, members, _stop_line(stop), timeout=20)
            thread.join(timeout=30)
            for proc in recording.procs:  # a member that never saw its stop file: end its ssh
                if proc.poll() is None:
                    stop_process(proc)
        closed.set()
    _warn_failed(member_results, warn)


def _replaced_since(name: str, failed: set[str], began: float, done: threading.Event,
                    replace_failed: bool) -> tuple[list[Node], ClusterRecord]:
    """Members whose follower failed and that were replaced since the stream began (run --follow
    --replace-failed: the recovery loop beside it replaces a lost node), once they are: their new disk
    holds only the new attempts' lines, so following them again repeats nothing.  ([], ...) when none."""
    record = state.load(name)
    while failed and replace_failed and not done.wait(1.0):
        record = state.load(name)
        new = [n for n in record.nodes
               if n.name in failed and float((n.extra.get("replaced") or {}).get("at") or 0) > began]
        if new:
            return new, record
    return [], record


def exit_code(session: ClusterSession, job: JobRecord) -> int | None:
    """The job's exit code from the leader (None: it ended without one); refreshes ``job``'s state."""
    cluster = session.record
    code = run_on_node(session, cluster.node(job.leader), scripts.read_exit_script(job.id), timeout=20).stdout.strip()
    refreshed = {j.id: j for j in records.refresh(session)}
    if job.id in refreshed:
        job.state, job.exit_code = refreshed[job.id].state, refreshed[job.id].exit_code
    return int(code) if code.lstrip("-").isdigit() else None


# --- jobs from before per-rank files: the leader's log, tagged by mpirun ---------------------

def legacy_filter(ranks: set[int] | None, untagged: bool = True) -> Callable[[str], bool]:
    """Keep lines of these ranks (None: keep all) and, with ``untagged``, mpirun's own lines."""
    if ranks is None:
        return lambda line: True

    def keep(line: str) -> bool:
        m = TAG_RE.match(line)
        return untagged if m is None else int(m.group(2)) in ranks

    return keep


def legacy_ranks_on(session: ClusterSession, job: JobRecord, node_name: str) -> set[int]:
    """Ranks of ``job`` that ran on ``node_name`` (from its rank records there)."""
    cluster = session.record
    node = cluster.node(node_name)
    d = f'"$HOME/{JOBS_DIR}/{scripts.check_id(job.id)}/ranks"'
    result = run_on_node(session, node, f'ls {d} 2>/dev/null | grep "^$(uname -n)\\." || true', timeout=20)
    return {int(name.rsplit(".", 1)[-1]) for name in result.stdout.split() if name.rsplit(".", 1)[-1].isdigit()}


def legacy_show(session: ClusterSession, job: JobRecord, on_line: LineSink, *, follow: bool,
                keep: Callable[[str], bool], lines: int | None) -> None:
    """The leader's log (or follow it)."""
    cluster = session.record
    leader = cluster.node(job.leader)

    def emit(text: str) -> None:
        if keep(text):
            on_line(text)

    if follow:
        start = 1
        if lines:
            count = run_on_node(session, leader, f'wc -l < "$HOME/{JOBS_DIR}/{job.id}/log"', timeout=20).stdout.strip()
            start = max(1, int(count or 0) - lines + 1) if count.isdigit() else 1
        run_on_node(session, leader, "sh -s", on_line=lambda _n, _s, text: emit(text),
                    stdin_data=scripts.follow_script(job.id, start).encode())
        return
    result = run_on_node(session, leader, scripts.tail_script(job.id, lines), timeout=60)
    if not result.ok:  # the node answered but has no log: it was cleaned away
        why = result.reason if result.error else "it was removed (`clustertool clean`)"
        raise ToolError(f"no log for job {job.id} on {job.leader}: {why}")
    for text in result.stdout.splitlines():
        emit(text)
