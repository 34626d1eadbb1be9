"""`clustertool stacks`: the Python stack of every rank of a running job, folded across ranks.

Every node of the job runs ``nodeprogs/stacks.py`` at once: it finds the job's ranks there (their
``ranks/`` records, checked against the job's environment marker) and asks py-spy for each one's
stack, or, without py-spy, /proc for its state.  Ranks whose stacks are the same (the same
(function, file name, line) list of the thread that matters) form one group; a hang shows as one
big group and the few ranks that are elsewhere.  Beside the stacks, each rank's PyTorch Flight Recorder (its last
collectives, where the rank runs clustertool's hook: ranks of the node launchers) is folded by jobs/flightfold.py,
naming the ranks whose collective sequence differs.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR
from clustertool.core.model import JobRecord, jsonable
from clustertool.jobs import flightfold, records, scripts
from clustertool.jobs.jobrequests import StacksRequest
from clustertool.jobs.kill import pick_running
from clustertool.remote.group import run_on_node, run_on_nodes

SHOWN_FRAMES = 5  # frames a group's line shows at most (innermost first)
_LIBRARY = re.compile(r"/lib(64)?/python\d+(\.\d+)?t?/|/(site|dist)-packages/")


@dataclass
class Frame:
    function: str
    file: str
    line: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.function, os.path.basename(self.file), self.line

    @property
    def library(self) -> bool:
        """Python's own modules and installed packages, not the user's code."""
        return self.file.startswith("<") or bool(_LIBRARY.search(self.file))

    def text(self) -> str:
        if self.library:
            return self.function
        where = f"{os.path.basename(self.file)}:{self.line}"
        return where if self.function == "<module>" else f"{self.function} ({where})"


@dataclass
class RankStack:
    """One rank: the stack that counts (``thread``'s ``frames``), every thread, /proc's view."""

    rank: int
    node: str
    pid: int
    method: str  # "py-spy" | "proc" (py-spy absent, switched off or failed) | "gone"
    thread: str | None = None
    frames: list[Frame] = field(default_factory=list)
    threads: list[dict] = field(default_factory=list)
    proc: dict | None = None
    note: str | None = None  # why not py-spy; why gone
    py_spy: str | None = None  # the py-spy that was asked (on the node)
    flight: dict | None = None  # its Flight Recorder's summary (nodeprogs/flightrec.py), or why there is none

    @property
    def key(self) -> tuple:
        if self.method == "py-spy":
            return ("py-spy", self.thread if self.thread != "MainThread" else None, *(f.key for f in self.frames))
        if self.method == "proc":
            proc = self.proc or {}
            return "proc", _note_kind(self.note), proc.get("state"), proc.get("syscall"), proc.get("wchan")
        return ("gone",)


@dataclass
class StackGroup:
    ranks: list[int]
    nodes: list[str]
    summary: str
    sample: RankStack  # the group's first rank

    @property
    def label(self) -> str:
        word = "rank" if len(self.ranks) == 1 else "ranks"
        return f"{word} {fold_ranks(self.ranks)} ({nodeset.fold(self.nodes)})"

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "label": self.label, "nodes": nodeset.fold(self.nodes),
                "method": self.sample.method, "summary": self.summary}


@dataclass
class StacksResult:
    job: JobRecord
    ranks: list[RankStack]
    groups: list[StackGroup]
    problems: list[str]  # nodes that did not answer, ranks nobody reported: one line each
    exit_code: int = 0  # 255 when a node did not answer
    flight: list[str] = field(default_factory=list)  # the Flight Recorder's lines (jobs/flightfold.py)

    def to_dict(self) -> dict:
        """What `stacks --json` prints."""
        return {"job": self.job.id, "groups": [g.to_dict() for g in self.groups], "ranks": jsonable(self.ranks),
                "problems": self.problems, "flight": self.flight}


fold_ranks = flightfold.fold_ranks  # [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (one definition, there)


def _note_kind(note: str | None) -> str:
    """A fallback's reason without its detail (pids, messages), so that ranks fold."""
    return (note or "").split(":", 1)[0]


OWN_THREADS = ("clustertool-flight-recorder",)  # nodeprogs/frhook.py's thread: busy because `stacks` asked it to dump


def pick_thread(threads: list[dict], pid: int) -> dict | None:
    """The thread that counts: the main thread, unless it idles while another one works; a thread
    with Python frames over one without.  clustertool's own thread in the rank (the flight recorder's
    server, which is dumping at that very moment) never counts."""
    with_frames = [t for t in threads if t.get("frames") and t.get("name") not in OWN_THREADS]
    main = next((t for t in with_frames if t.get("id") == pid or t.get("name") == "MainThread"), None)
    busy = [t for t in with_frames if t.get("active")]
    if main is not None and (main.get("active") or not busy):
        return main
    return (busy or with_frames)[0] if with_frames else None


def rank_stack(node: str, entry: dict) -> RankStack:
    """One rank of a node program's answer."""
    rank, pid = int(entry["rank"]), int(entry["pid"])
    if not entry.get("alive"):
        return RankStack(rank, node, pid, "gone", note=entry.get("note"))
    threads = entry.get("threads") or []
    out = RankStack(rank, node, pid, entry.get("method") or "proc", threads=threads, proc=entry.get("proc"),
                    note=entry.get("note"), py_spy=entry.get("py_spy"),
                    flight=entry["flight"] if isinstance(entry.get("flight"), dict) else None)
    chosen = pick_thread(threads, pid) if out.method == "py-spy" else None
    if chosen is not None:
        out.thread = chosen.get("name")
        out.frames = [Frame(str(f.get("function")), str(f.get("file")), int(f.get("line") or 0))
                      for f in chosen["frames"]]
    elif out.method == "py-spy":
        out.note = "py-spy saw no Python frames"
    return out


def describe_frames(frames: list[Frame], limit: int = SHOWN_FRAMES) -> str:
    """Innermost first; the innermost frame always, then the user's frames (a run of library frames
    between them shows as one "…"), at most ``limit`` items."""
    if not frames:
        return "(no Python frames)"
    items = [frames[0].text()]
    for frame in frames[1:]:
        items.append("…" if frame.library else frame.text())
        if items[-2:] == ["…", "…"]:
            items.pop()
    while items and items[-1] == "…":
        items.pop()
    if len(items) > limit:
        items = items[:limit] + ["…"]
    return " ← ".join(items)


def _cpu(stacks: list[RankStack]) -> str:
    """CPU seconds of a group's ranks: "1.5s", or the range "0.03-0.05s"."""
    seconds = sorted(float((s.proc or {}).get("cpu_s") or 0) for s in stacks)
    low, high = (seconds[0], seconds[-1]) if seconds else (0.0, 0.0)
    return f"{low:g}s" if low == high else f"{low:g}-{high:g}s"


def describe_proc(stack: RankStack, group: list[RankStack] | None = None) -> str:
    proc = stack.proc or {}
    state = proc.get("state") or "?"
    call = proc.get("syscall")
    where = (f" in {call}" if call and call not in ("none", "running") else "")
    where += f" (wchan {proc['wchan']})" if proc.get("wchan") else ""
    return (f"[/proc; {stack.note or 'no py-spy'}] state {state}{where}, cpu {_cpu(group or [stack])}: "
            f"{proc.get('cmdline') or '?'}")


def describe(stack: RankStack, group: list[RankStack] | None = None) -> str:
    """A group's line after its label (``stack``: its first rank; ``group``: all of them)."""
    if stack.method == "gone":
        return f"not running ({stack.note or 'process gone'})"
    if stack.method == "proc":
        return describe_proc(stack, group)
    thread = f"[thread {stack.thread}] " if stack.thread not in (None, "MainThread") else ""
    return thread + (describe_frames(stack.frames) if stack.frames else f"({stack.note})")


def fold(stacks: list[RankStack]) -> list[StackGroup]:
    """Ranks with the same stack, biggest group first (lonely ranks last), then by first rank."""
    by_key: dict[tuple, list[RankStack]] = {}
    for s in sorted(stacks, key=lambda s: s.rank):
        by_key.setdefault(s.key, []).append(s)
    groups = [StackGroup([s.rank for s in members], sorted({s.node for s in members}),
                         describe(members[0], members), members[0]) for members in by_key.values()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0]))


def parse_node(node: str, stdout: str) -> list[RankStack]:
    """A node program's JSON answer -> its ranks (ValueError when it is not one)."""
    doc = json.loads(stdout)
    return [rank_stack(node, entry) for entry in doc["ranks"]]


def local_py_spy() -> list[str]:
    """This machine's py-spy paths, tried first on nodes (where nodes share this machine's files, as a
    local cluster does, or the same path exists there; a path a node lacks is skipped)."""
    found = [shutil.which("py-spy") or "", os.path.join(os.path.dirname(sys.executable), "py-spy")]
    return [p for p in dict.fromkeys(found) if p and os.access(p, os.X_OK)]


def node_args(job_id: str, py_spy: str | bool | None, timeout: float) -> dict:
    """The node program's ARGS: ``py_spy`` False: /proc only; a path: try it first."""
    tries: list[str] | bool = False
    if py_spy is not False:
        tries = ([py_spy] if isinstance(py_spy, str) else []) + local_py_spy()
    return {"job": scripts.check_id(job_id), "jobs_dir": JOBS_DIR, "env": JOB_ENV, "py_spy": tries,
            "timeout": timeout}


def _problems(job: JobRecord, found: list[RankStack], unanswered: list[str], empty: list[str]) -> list[str]:
    out = list(unanswered)
    if empty:
        out.append(f"{nodeset.fold(empty)}: no rank of this job recorded there")
    missing = sorted(set(range(job.np)) - {s.rank for s in found})
    if missing and not unanswered:
        out.append(f"ranks {fold_ranks(missing)}: no node reported them (not started yet, or gone)")
    return out


def stacks(session: ClusterSession, request: StacksRequest) -> StacksResult:
    """Every rank's stack of a running job (``request.job``: id, prefix or name; None: the one running job)."""
    py_spy, timeout = request.py_spy, request.timeout
    cluster = session.reload()
    job = pick_running(records.refresh(session), request.job)
    if request.job is None:
        session.report(f"job {job.id} (the one running)")
    known = {n.name for n in cluster.nodes}
    nodes = [cluster.node(n) for n in job.nodes if n in known]
    program = nodeprogs.program_text("stacks", node_args(job.id, py_spy, timeout))
    result = run_on_nodes(session, nodes, nodeprogs.python_command(), timeout=timeout + 30, stdin_data=program)
    found: list[RankStack] = []
    unanswered = [f"{n}: no longer a node of the cluster" for n in job.nodes if n not in known]
    empty: list[str] = []
    for r in result.results:
        try:
            ranks = parse_node(r.node, r.stdout) if r.ok else None
        except (ValueError, KeyError, TypeError):
            ranks = None
        if ranks is None:
            unanswered.append(f"{r.node}: {r.reason or 'an answer that is not the stacks program’s JSON'}")
        elif not ranks:
            empty.append(r.node)
        found += ranks or []
    found.sort(key=lambda s: s.rank)
    return StacksResult(job, found, fold(found), _problems(job, found, unanswered, empty),
                        255 if unanswered else 0, flightfold.fold(found))


def saved(session: ClusterSession, job: JobRecord) -> list[StackGroup]:
    """The folded stacks the supervisor saved when it found ``job`` hung (``hang/<node>`` on the leader)."""
    return fold(saved_ranks(session, job))


def saved_ranks(session: ClusterSession, job: JobRecord) -> list[RankStack]:
    """Every rank's stack (and Flight Recorder) as the supervisor saved them when it found ``job`` hung."""
    d = scripts.job_dir_sh(job.id)
    line = f'for f in {d}/hang/*; do [ -f "$f" ] && echo "$(basename "$f") $(base64 -w0 < "$f")"; done; true'
    result = run_on_node(session, session.record.leader, line, timeout=20)
    found: list[RankStack] = []
    for entry in result.stdout.splitlines() if result.ok else []:
        node, _, b64 = entry.partition(" ")
        try:
            found += parse_node(node, base64.b64decode(b64).decode("utf-8", "replace"))
        except (ValueError, KeyError, TypeError, binascii.Error):
            continue
    return sorted(found, key=lambda s: s.rank)
