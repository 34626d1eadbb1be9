"""The controller's loop: every few seconds, ask the leader which jobs wait for a replacement (the restart
loop's wait state, nodeprogs/waiting.py) and hand each open wait to the handler once; count the rounds the
leader does not answer.  What it saw goes to a status file (``controller.json`` in the cluster's folder)
that `status` can read without asking anyone.

Phase A: the handler only notes the wait (:func:`note_only`) and claims nothing, so `clustertool recover` on
the user's machine still replaces the node as before.  Phase B hands it ``jobs.recovery``'s replacement
(claim with ``mkdir replacing.<attempt>`` on the leader, `replace`, then ``replaced``), and a leader silent
for ``LEADER_MISSES`` rounds to the lost-leader flow.
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
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import Reporter, silent
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_node

LEADER_MISSES = 3  # rounds in a row without the leader's answer before it counts as lost (jobs/recovery.py's)
ASK_TIMEOUT_S = 15.0


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


Handler = Callable[[ClusterSession, Wait], str]  # acts on one open wait; a line saying what it did


def note_only(session: ClusterSession, wait: Wait) -> str:
    """Phase A's handler: say what waits, claim nothing (`clustertool recover` still does the replacing)."""
    return (f"job {wait.job} waits on {session.record.leader.name} for {nodeset.fold(list(wait.nodes))} to be "
            f"replaced (attempt {wait.attempt}, until {time.strftime('%H:%M:%S', time.localtime(wait.until))})")


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
                 status_path: Path | None = None):
        self.session, self.handle, self.report, self.status_path = session, handle, report, status_path
        self.status = Status(os.getpid(), session.name, time.time())
        self.done: set[tuple[str, int]] = set()  # (job, attempt) handed to the handler already

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
            self.write()
            return []
        if not self.status.leader_answers:
            self.report(f"the leader {leader} answers again")
        self.status.misses, self.status.leader_answers = 0, True
        now, waits = answer
        self.status.waiting = [asdict(w) for w in waits]
        fresh = [w for w in waits if w.open(now) and (w.job, w.attempt) not in self.done]
        for wait in fresh:
            self.done.add((wait.job, wait.attempt))
            line = self.handle(self.session, wait)
            self.report(line)
            self.status.handled.append({"job": wait.job, "attempt": wait.attempt, "nodes": list(wait.nodes),
                                        "at": time.time(), "line": line})
        self.write()
        return fresh

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
