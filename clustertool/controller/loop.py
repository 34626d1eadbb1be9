"""The controller's loop: every few seconds, ask the leader which jobs wait for a replacement (the restart
loop's wait state, nodeprogs/waiting.py) and hand each open wait to the handler once; count the rounds the
leader does not answer.  What it saw goes to a status file (``controller.json`` in the cluster's folder)
that `status` can read without asking anyone.

The controller's handler is :func:`replacer`: ``jobs.replacing.replace_waiting`` (claim with ``mkdir
replacing.<attempt>`` on the leader, `replace`, then ``replaced`` naming who replaced the node), so
`clustertool recover` on the user's machine and the controller never replace one node twice.  A handling
that did nothing (the replacement failed; the claim given back) is tried again after ``RETRY_S``.
:func:`note_only` only says what waits (for a loop that must not act).  A leader silent for
``LEADER_MISSES`` rounds goes to ``on_leader_lost`` (:func:`relauncher`: `recover`'s lost-leader flow), when
one is given.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import Reporter, silent
from clustertool.jobs import recovery
from clustertool.jobs.replacing import NotReplaced, replace_waiting
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_node

LEADER_MISSES = 3  # rounds in a row without the leader's answer before it counts as lost (jobs/recovery.py's)
ASK_TIMEOUT_S = 15.0
RETRY_S = 30.0  # after a handling that did nothing (a failed replacement), the next try


@dataclass(frozen=True)
class Wait:
    """One job's wait for a replacement, as the leader's restart loop wrote it."""

    job: str
    nodes: tuple[str, ...]
    attempt: int
    since: float
    until: float
    claimed: bool = False  # a replacer (`recover`, or a controller) has it
    replaced: bool = False  # answered: the restart loop goes on
    killed: bool = False

    def open(self, now: float) -> bool:
        """Nobody has it, nobody answered it, and the restart loop still waits."""
        return not (self.claimed or self.replaced or self.killed) and self.until > now


def parse(stdout: str) -> tuple[float, list[Wait]]:
    """waiting.py's document: (the leader's clock, the waits)."""
    doc = json.loads(stdout.strip().splitlines()[-1])
    waits = [Wait(str(w["job"]), tuple(w.get("nodes") or ()), int(w.get("attempt") or 0), float(w.get("since") or 0),
                  float(w.get("until") or 0), bool(w.get("claimed")), bool(w.get("replaced")), bool(w.get("killed")))
             for w in doc.get("waiting") or []]
    return float(doc.get("now") or time.time()), waits


def ask_leader(session: ClusterSession) -> tuple[float, list[Wait]] | None:
    """The leader's waits (None: the leader did not answer)."""
    found = run_on_node(session, session.record.leader, python_command(), timeout=ASK_TIMEOUT_S,
                        stdin_data=program_text("waiting", {"jobs_dir": JOBS_DIR}))
    if not found.ok:
        return None
    return parse(found.stdout)


@dataclass(frozen=True)
class Handled:
    """What a handler did with one wait: its line, and whether it is done with it (False: try again later)."""

    line: str
    done: bool = True


Handler = Callable[[ClusterSession, Wait], Handled]  # acts on one open wait
LeaderLost = Callable[[ClusterSession], "str | None"]  # the leader counts as lost: a line saying what was done


def note_only(session: ClusterSession, wait: Wait) -> Handled:
    """Say what waits, claim nothing (`clustertool recover` does the replacing)."""
    return Handled(f"job {wait.job} waits on {session.record.leader.name} for {nodeset.fold(list(wait.nodes))} to "
                   f"be replaced (attempt {wait.attempt}, until "
                   f"{time.strftime('%H:%M:%S', time.localtime(wait.until))})")


def relauncher(session: ClusterSession) -> str | None:
    """The controller on this machine, when the leader is lost: `recover`'s flow (jobs/recovery.py), with the same
    claim (a file per job and attempt in this home), so `recover` running here too never does it twice: the
    leader replaced, the jobs run with --replace-failed planned again there; None when no job needed it."""
    loop = recovery.Loop(session, None, ())
    acted = loop.leader_lost()
    if loop.result.problem:
        return loop.result.problem
    if not acted:
        return None
    done = ", ".join(r.job for r in loop.result.recovered)
    return (f"the leader was replaced; started again there: {done}" if done else
            "the leader is being replaced by another recovery loop on this machine")


def replacer(by: str, copy: tuple[str, ...] = ()) -> Handler:
    """The controller's handler: replace the nodes a job waits for (jobs/replacing.py), naming itself ``by``."""
    def handle(session: ClusterSession, wait: Wait) -> Handled:
        try:
            done = replace_waiting(session, wait.job, wait.attempt, list(wait.nodes), copy=copy, by=by,
                                   report=session.report, since=wait.since)
        except NotReplaced as exc:
            return Handled(f"{exc.message}; trying again in {RETRY_S:.0f}s", done=False)
        if done is None:
            return Handled(f"job {wait.job}: another replacer has the wait of attempt {wait.attempt}")
        return Handled(f"job {wait.job}: {nodeset.fold(done.nodes)} replaced by {by} in {done.seconds:.1f}s")
    return handle


@dataclass
class Status:
    """What the controller last saw (written whole to ``controller.json`` every round)."""

    pid: int
    cluster: str
    started: float
    rounds: int = 0
    at: float = 0.0
    leader: str = ""
    leader_answers: bool = True
    misses: int = 0
    waiting: list[dict[str, Any]] = field(default_factory=list)
    handled: list[dict[str, Any]] = field(default_factory=list)
    stopped: float | None = None


class Loop:
    """The controller's rounds over one cluster."""

    def __init__(self, session: ClusterSession, handle: Handler = note_only, report: Reporter = silent,
                 status_path: Path | None = None, on_leader_lost: LeaderLost | None = None):
        self.session, self.handle, self.report, self.status_path = session, handle, report, status_path
        self.on_leader_lost = on_leader_lost
        self.status = Status(os.getpid(), session.name, time.time())
        self.done: set[tuple[str, int]] = set()  # (job, attempt) handed to the handler already
        self.retry_at: dict[tuple[str, int], float] = {}  # (job, attempt) -> when to hand it again (monotonic)

    def round(self) -> list[Wait]:
        """One look at the leader; the waits handed to the handler this round."""
        self.session.reload()
        leader = self.session.record.leader.name
        answer = ask_leader(self.session)
        self.status.rounds, self.status.at, self.status.leader = self.status.rounds + 1, time.time(), leader
        if answer is None:
            self.status.misses += 1
            self.status.leader_answers = False
            self.report(f"the leader {leader} does not answer ({self.status.misses} round(s) in a row"
                        + ("; it counts as lost" if self.status.misses >= LEADER_MISSES else "") + ")")
            if self.status.misses >= LEADER_MISSES and self.on_leader_lost is not None:
                self.leader_lost(leader)
            self.write()
            return []
        if not self.status.leader_answers:
            self.report(f"the leader {leader} answers again")
        self.status.misses, self.status.leader_answers = 0, True
        now, waits = answer
        self.status.waiting = [asdict(w) for w in waits]
        fresh = [w for w in waits if w.open(now) and (w.job, w.attempt) not in self.done
                 and self.retry_at.get((w.job, w.attempt), 0.0) <= time.monotonic()]
        for wait in fresh:
            key = (wait.job, wait.attempt)
            self.done.add(key)
            try:
                outcome = self.handle(self.session, wait)
            except ToolError as exc:  # the controller goes on: the next round tries again
                outcome = Handled(f"job {wait.job}: {exc.message}; trying again in {RETRY_S:.0f}s", done=False)
            if not outcome.done:
                self.done.discard(key)
                self.retry_at[key] = time.monotonic() + RETRY_S
            self.report(outcome.line)
            self.status.handled.append({"job": wait.job, "attempt": wait.attempt, "nodes": list(wait.nodes),
                                        "at": time.time(), "line": outcome.line, "done": outcome.done})
        self.write()
        return fresh

    def leader_lost(self, leader: str) -> None:
        """Hand a lost leader to ``on_leader_lost`` (it replaces the leader and starts its jobs again there)."""
        assert self.on_leader_lost is not None
        try:
            line = self.on_leader_lost(self.session)
        except ToolError as exc:
            line = f"the leader {leader} is lost and could not be replaced: {exc.message} (trying again)"
        if line:
            self.report(line)
            self.status.handled.append({"job": None, "leader": leader, "at": time.time(), "line": line})
        self.session.reload()
        if self.session.record.leader.name != leader or line:
            self.status.misses = 0

    def run(self, stop: threading.Event, poll: float = 2.0) -> None:
        """Rounds until ``stop`` is set."""
        self.write()
        while not stop.is_set():
            self.round()
            stop.wait(poll)
        self.status.stopped = time.time()
        self.write()

    def write(self) -> None:
        if self.status_path is None:
            return
        tmp = self.status_path.with_name(self.status_path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self.status)))
        os.replace(tmp, self.status_path)
