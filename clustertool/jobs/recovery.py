"""Lose a node, keep the job: the recovery loop on the user's machine (run --replace-failed).

Who replaces a node: the machine with the cloud credentials, never a node (nodes hold no keys).
The job's restart loop on the leader (nodeprogs/restarts.py) finds the node lost (the supervisor,
or a spot notice: nodeprogs/spot.py), stops what is left, and writes ``waiting`` (which nodes, until
when) in its attempts.json.  This loop (`clustertool recover`, or beside `run --follow
--replace-failed`) asks the leader every few seconds; when a job waits, it claims that wait (a
folder made atomically on the leader, so two loops never replace the same node twice), calls the
same code as `clustertool replace`, puts back what the new disk lacks (the job agent of a node
launcher; ``copy`` paths through the relay), then writes ``replaced`` in the job's folder: the leader
starts the next attempt with the same job id on the new node.  Nobody within --replace-wait: the
leader stops the job and says why.

A lost leader takes the restart loop with it.  This loop notices (the leader does not answer for a
few rounds), replaces the leader, stops what is left of the job on the members, and starts the job
again on the new leader with the same job id and the next restart count; the job's attempts so far go
with it.  The job is planned again from its kept request
(jobs/replan.py), so node launchers (torchrun ...) and a new leader address are covered.  A checkpoint on the
old leader's disk is gone with it: such a job starts from its beginning (keep checkpoints on a shared filesystem
to resume).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from clustertool.cluster.replace import replace
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import JobRecord, jsonable
from clustertool.jobs import records, replan, scripts
from clustertool.jobs.jobrequests import RecoverRequest
from clustertool.jobs.recoveryprep import IMDS_ENV, keep_launch, kept_request, launch_path, preempt_signal, spot_program
from clustertool.jobs.replacing import NotReplaced, Recovered, replace_waiting
from clustertool.remote.group import run_on_node, run_on_nodes

__all__ = ["IMDS_ENV", "Recovered", "keep_launch", "preempt_signal", "spot_program"]  # run's side: recoveryprep.py
_launch_path = launch_path
LEADER_MISSES = 3  # polls in a row without the leader's answer before it counts as lost
RETRY_S = 30.0  # after a replacement failed (no capacity ...), the next try


@dataclass
class RecoverResult:
    """What a recovery loop did (``to_dict()``: `recover --json`)."""

    cluster: str
    watched: list[str] = field(default_factory=list)
    recovered: list[Recovered] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)  # job id -> its state when the loop ended
    exit_code: int | None = None  # the job's, when one job was watched to its end
    problem: str | None = None  # why the loop stopped early (the leader lost)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def _watched(jobs: list[JobRecord], job_id: str | None) -> list[JobRecord]:
    return [j for j in jobs if j.id == job_id] if job_id else [j for j in jobs if j.replace_failed and
                                                              j.state == "running"]


class Loop:
    """One recovery loop over a cluster's jobs (``job_id``: that one only)."""

    def __init__(self, session: ClusterSession, job_id: str | None, copy: Sequence[str],
                 relaunched: threading.Event | None = None) -> None:
        self.session, self.job_id, self.copy, self.report = session, job_id, list(copy), session.report
        self.relaunched = relaunched or threading.Event()  # set when a job was started again on a new leader
        self.retry_at: dict[str, float] = {}  # job id -> when to try a replacement that failed again
        self.result = RecoverResult(session.name)
        self.misses = 0

    def leader_lost(self) -> bool:
        """The leader stopped answering: replace it and start its jobs again there (False: nothing to do)."""
        leader = self.session.record.leader.name
        jobs = [j for j in _watched(records.load_all(self.session.name), self.job_id)
                if j.state == "running" and j.replace_failed]
        if not jobs:
            return False
        if not all(_claim(j) for j in jobs):  # another loop on this machine replaces it: wait for it to answer
            self.misses = 0
            return True
        self.report(f"the leader {leader} does not answer: replacing it (the restart loop of "
                    f"{', '.join(j.id for j in jobs)} ran there)")
        t0, since, address = time.monotonic(), time.time(), self.session.record.leader.address
        replace(self.session, leader)
        self.misses = 0
        for job in jobs:
            why = relaunch(self.session, job, f"{leader} lost (the leader)", address)
            if why:
                self.result.problem = why
                return False
            self.result.recovered.append(Recovered(job.id, [leader], f"{leader} lost (the leader)",
                                                   len(job.attempts), since, time.time(),
                                                   round(time.monotonic() - t0, 2)))
        self.relaunched.set()
        return True

    def leader_answers(self) -> bool:
        ok = run_on_node(self.session, self.session.record.leader, "true", timeout=10).ok
        self.misses = 0 if ok else self.misses + 1
        return ok

    def round(self) -> bool:
        """One look at the leader; False once there is nothing more to watch."""
        self.session.reload()
        if not self.leader_answers():
            if self.misses >= LEADER_MISSES and self.leader_lost():
                return True
            if self.misses >= LEADER_MISSES:
                leader = self.session.record.leader.name
                self.result.problem = (f"the leader {leader} does not answer: the jobs' restart loop ran there; "
                                       f"`clustertool replace {leader} --yes`, then run the job again (it resumes "
                                       "from its checkpoint where that was not on the leader's disk)")
                return False
            return True
        watched = _watched(records.refresh(self.session), self.job_id)
        for job in watched:
            self.result.states[job.id] = job.state
            if job.id not in self.result.watched:
                self.result.watched.append(job.id)
            if job.state == "running" and job.waiting and self.retry_at.get(job.id, 0.0) <= time.monotonic():
                self.handle(job)
        return any(j.state == "running" for j in watched)

    def handle(self, job: JobRecord) -> None:
        wait = job.waiting or {}
        nodes, number = [str(n) for n in wait.get("nodes") or []], int(wait.get("attempt") or 0)
        cause = next((a.get("cause") for a in reversed(job.attempts) if a.get("cause")), None)
        try:
            done = replace_waiting(self.session, job.id, number, nodes, copy=self.copy, by=f"recover on {_host()}",
                                   report=self.report, cause=cause, since=float(wait.get("since") or 0))
        except NotReplaced as exc:
            until = time.strftime("%H:%M:%S", time.localtime(float(wait.get("until") or 0)))
            self.report(f"{exc.message}; trying again in {RETRY_S:.0f}s (the leader waits until {until})")
            self.retry_at[job.id] = time.monotonic() + RETRY_S
            return
        if done is not None:
            self.result.recovered.append(done)


def _host() -> str:
    return socket.gethostname() or "this machine"


def _claim(job: JobRecord) -> bool:
    """This loop, and no other on this machine, starts ``job`` again after this attempt (a file made once)."""
    records.jobs_dir(job.cluster).mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(records.jobs_dir(job.cluster) / f"{job.id}.relaunch.{len(job.attempts)}",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return True
    except FileExistsError:
        return False


def relaunch(session: ClusterSession, job: JobRecord, cause: str, address: str) -> str | None:
    """Start ``job`` again on a new leader: what is left of it on the members stopped, then the job planned
    again from its kept request (jobs/replan.py: new hostfile, MASTER_ADDR, agent on every node) with its
    attempts so far (the last one ended by ``cause``).  A job without a kept request (run before it was kept)
    has its kept launch files sent again: mpirun jobs only, and only when the leader kept its ``address``.
    None, or why it could not."""
    request = kept_request(job)
    path = _launch_path(job)
    if request is None and (job.launcher != "mpirun" or not path.exists() or session.record.leader.address != address):
        return (f"job {job.id} ({job.launcher}) cannot be started again from here after its leader was lost: "
                "run it again (it resumes from its checkpoint where that was not on the leader's disk)")
    attempts = [dict(a) for a in job.attempts] or [{"attempt": 1, "restart_count": 0, "start": job.started}]
    if len(attempts) - 1 >= job.restarts:
        return f"job {job.id}: its leader was lost and every restart is used (--restarts {job.restarts})"
    attempts[-1].update(end=time.time(), code=None, cause=cause, kind="lost")
    record = session.record
    members = [record.node(n) for n in job.nodes if n != record.leader.name and n in {x.name for x in record.nodes}]
    run_on_nodes(session, members, "sh -s", timeout=40, stdin_data=scripts.kill_script(job.id, grace=2.0,
                                                                                      mark=False).encode())
    d = scripts.job_dir_sh(job.id)
    doc = {"restarts": job.restarts, "codes": job.restart_on_exit_codes, "attempts": attempts, "verdict": None}
    prefix = f"mkdir -p {d} && printf %s {shlex.quote(json.dumps(doc))} > {d}/attempts.json\n"
    session.report(f"job {job.id}: starting it again on the new {record.leader.name} (CLUSTERTOOL_RESTART_COUNT="
           f"{len(attempts)}; a checkpoint on the old leader's disk is gone)")
    if request is not None:
        try:
            return replan.relaunch(session, job, request, prefix)
        except ToolError as exc:
            return f"job {job.id}: could not start it again on the new leader: {exc.message}"
    started = run_on_node(session, record.leader, "sh -s", timeout=30, stdin_data=(prefix + path.read_text()).encode())
    if not started.ok:
        return f"job {job.id}: could not start it again on the new leader: {started.reason}"
    return None


def recover(session: ClusterSession, request: RecoverRequest = RecoverRequest(), *,
            stop: threading.Event | None = None, relaunched: threading.Event | None = None) -> RecoverResult:
    """Watch the cluster's running jobs run with --replace-failed (``request.job``: that job, until it ends),
    replace the nodes their leader waits for, tell it to go on; return what was done (``stop``: set to end
    the loop early; ``relaunched``: set when a job was started again on a new leader)."""
    job_id = request.job
    if job_id is not None:
        job = records.resolve(records.refresh(session), job_id)
        if not job.replace_failed:
            raise UsageError(f"job {job.id} was not run with --replace-failed: its leader does not wait for a "
                             "replacement", hint="run it with --restarts N --replace-failed")
        job_id = job.id
    loop = Loop(session, job_id, request.copy, relaunched)
    stop = stop or threading.Event()
    while not stop.is_set() and loop.round():
        stop.wait(request.poll)
    if job_id is not None and loop.result.states.get(job_id) not in (None, "running"):
        job = records.resolve(records.load_all(session.name), job_id)
        loop.result.exit_code = job.exit_code
    return loop.result


class Beside:
    """A recovery loop for one job in a thread, with a session of its own, beside the stream that follows it."""

    def __init__(self, session: ClusterSession, job_id: str, warn: Callable[[str], None]) -> None:
        self.stop, self.relaunched = threading.Event(), threading.Event()
        self.result = RecoverResult("")
        self.thread = threading.Thread(target=self.work, args=(session.fresh(), job_id, warn), name="recovery",
                                       daemon=True)

    def work(self, session: ClusterSession, job_id: str, warn: Callable[[str], None]) -> None:
        try:
            self.result = recover(session, RecoverRequest(job_id), stop=self.stop, relaunched=self.relaunched)
            if self.result.problem:
                warn(self.result.problem)
        except ToolError as exc:
            warn(f"recovery stopped: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))

    def started_again(self) -> bool:
        """After the stream ended without an exit code: wait while the loop runs; True once it started the
        job again on a new leader (the old one was lost, with the stream), so the caller follows it again."""
        while self.thread.is_alive() and not self.relaunched.wait(0.5):
            pass
        again = self.relaunched.is_set()
        self.relaunched.clear()
        return again


@contextmanager
def alongside(session: ClusterSession, job_id: str, warn: Callable[[str], None]) -> Iterator[Beside]:
    """A recovery loop for ``job_id`` in a thread while the caller follows the job (run --follow)."""
    beside = Beside(session, job_id, warn)
    beside.thread.start()
    try:
        yield beside
    finally:
        beside.stop.set()
        beside.thread.join(timeout=120)
