"""Why a job failed: the rank that failed first, on which node, how it ended, its last stderr lines.

Asked once, when a job is first seen failed, and kept in its record.  The facts come from the job's
folders on its nodes: a node launcher's agent writes ``failure`` (jobagent.py) on its node; the
leader's supervisor writes ``lost`` when a node stopped answering (nodeprogs/supervise.py); for
mpirun's own ranks, mpirun's log on the leader names the first rank that failed, and that rank's
stderr file on its node gives the last lines.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import JobRecord
from clustertool.jobs import scripts
from clustertool.remote.group import run_on_node, run_on_nodes

TAIL_LINES = 5
LOG_BYTES = 32768
# Open MPI 4's messages for the first rank that failed (its help-odls / help-orterun texts)
_OMPI_CODE = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
_OMPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_OMPI_LOST = re.compile(r"lost communication with a remote daemon\.[\s\S]*?Remote daemon:\s*\S+ on node (\S+)")


def _gather_script(job_id: str) -> str:
    d = scripts.job_dir_sh(job_id)
    return "\n".join([
        f"d={d}",
        'for f in failure lost; do [ -f "$d/$f" ] && echo "$f $(base64 -w0 < "$d/$f")"; done',
        'echo "ranks $(ls "$d/ranks" 2>/dev/null | sed "s/.*\\.//" | tr "\\n" " ")"',
        f'[ -f "$d/log" ] && echo "log $(tail -c {LOG_BYTES} "$d/log" | base64 -w0)"',
        "true",
    ])


def _decode(text: str) -> str:
    try:
        return base64.b64decode(text).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def parse_gathered(by_node: dict[str, str]) -> tuple[list[dict], dict[int, str], str]:
    """(failure records, each with its node; rank -> node; the leader's log tail) from the gather's output."""
    found, where, log = [], {}, ""
    for node, out in by_node.items():
        for line in out.splitlines():
            kind, _, rest = line.partition(" ")
            if kind in ("failure", "lost"):
                try:
                    rec = json.loads(_decode(rest))
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    rec["node"] = rec.get("node") if kind == "lost" else node
                    rec["kind"] = rec.get("kind") or kind
                    found.append(rec)
            elif kind == "ranks":
                for word in rest.split():
                    if word.isdigit():
                        where[int(word)] = node
            elif kind == "log":
                log = _decode(rest)
    return found, where, log


def from_mpirun_log(log: str) -> dict | None:
    """The first failed rank as mpirun says it: {"rank", "code"} or {"rank", "signal"}; or the node whose
    daemon it lost: {"kind": "lost", "address"}."""
    lost = _OMPI_LOST.search(log)
    if lost:
        return {"kind": "lost", "address": lost.group(1), "rank": None}
    m = _OMPI_SIGNAL.search(log)
    c = _OMPI_CODE.search(log)
    if c and (not m or c.start() < m.start()):
        return {"rank": int(c.group(1)), "code": int(c.group(2)), "signal": None}
    if m:
        return {"rank": int(m.group(1)), "code": None, "signal": int(m.group(3))}
    return None


ATTEMPT_MARK = " starting (CLUSTERTOOL_RESTART_COUNT="  # nodeprogs/restarts.py's line at each attempt


def last_attempt(log: str) -> str:
    """The part of mpirun's log from the last attempt of a job run with --restarts (all of it otherwise)."""
    at = log.rfind(ATTEMPT_MARK)
    return log if at < 0 else log[log.rfind("\n", 0, at) + 1:]


# A rank SIGKILLed by nobody of ours (the kernel's OOM killer, a person, the program itself) failed of
# nothing its peers did: their failures end ranks with an exception or an abort, never a SIGKILL. Each
# node's agent stamps an end when its runner gets the CPU after the wait, which on a starved box can come
# after a peer has already failed of that death and been stamped; within this window the SIGKILL is first.
KILLED_FIRST_WINDOW_S = 5.0
SIGKILL = 9


def earliest(candidates: list[dict]) -> dict:
    """The rank failure that came first: the earliest stamp, or an unprompted SIGKILL stamped at most
    KILLED_FIRST_WINDOW_S after it (nodeprogs/jobagent.py's first_failure keeps the same rule)."""
    first_seen = min(candidates, key=lambda f: f.get("time") or 0.0)
    t0 = first_seen.get("time") or 0.0
    killed = [f for f in candidates if f.get("signal") == SIGKILL and not f.get("stopped")
              and (f.get("time") or 0.0) - t0 <= KILLED_FIRST_WINDOW_S]
    return min(killed, key=lambda f: f.get("time") or 0.0) if killed else first_seen


def first(found: list[dict]) -> dict | None:
    """A node that stopped answering (what its peers' ranks then fail of), else the earliest rank that
    failed by itself (an unprompted SIGKILL first, see ``earliest``)."""
    lost = [f for f in found if f.get("kind") == "lost"]
    if lost:
        return min(lost, key=lambda f: f.get("time") or 0.0)
    candidates = [f for f in found if f.get("kind") == "hung" or f.get("rank") is not None]
    if not candidates:
        candidates = found
    return earliest(candidates) if candidates else None


def text(failure: dict | None) -> str:
    """`rank 5 on node-3 exited 1: RuntimeError: …`, `node-3 stopped answering`, or ''."""
    if not failure or failure.get("unknown"):
        return ""
    if failure.get("kind") == "lost":
        return f"{failure.get('node')} stopped answering"
    if failure.get("kind") == "hung":
        return "hung: no rank wrote a line or used CPU time (stopped by --hang-action kill)"
    who = f"rank {failure['rank']}" if failure.get("rank") is not None else "the launcher"
    on = f" on {failure['node']}" if failure.get("node") else ""
    if failure.get("code") is not None:
        how = f"exited {failure['code']}"
    elif failure.get("signal") is not None:
        how = f"killed by signal {failure['signal']}"
    else:
        how = "failed"
    lines = failure.get("tail") or []
    last = lines[-1].strip() if lines else ""
    if len(last) > 160:
        last = last[:157] + "..."
    return f"{who}{on} {how}" + (f": {last}" if last else "")


def _tail(session: ClusterSession, job: JobRecord, node_name: str, rank: int) -> list[str]:
    node = next((n for n in session.record.nodes if n.name == node_name), None)
    if node is None or not job.output_dir:
        return []
    out = shlex.quote(job.output_dir.replace("$HOME/", "")) if job.output_dir.startswith("$HOME/") else None
    base = f'"$HOME"/{out}' if out else shlex.quote(job.output_dir)
    if len(job.attempts) > 1:  # run --restarts: the last attempt's rank files (nodeprogs/restarts.py)
        base += f"/attempt.{len(job.attempts) - 1}"
    line = (f'for f in {base}/*/rank.*; do r=$(echo "${{f##*.}}" | sed "s/^0*//"); '
            f'if [ "${{r:-0}}" = {rank} ]; then tail -n {TAIL_LINES} "$f/stderr"; fi; done 2>/dev/null; true')
    result = run_on_node(session, node, line, timeout=20)
    return [x for x in result.stdout.splitlines() if x.strip()][-TAIL_LINES:] if result.ok else []


def explain(session: ClusterSession, job: JobRecord) -> dict:
    """The job's first failure (``{"unknown": True}`` where its nodes say nothing about it)."""
    cluster = session.record
    nodes = [n for n in cluster.nodes if n.name in job.nodes] or [cluster.leader]
    result = run_on_nodes(session, nodes, "sh -s", timeout=20, stdin_data=_gather_script(job.id).encode())
    found, where, log = parse_gathered({r.node: r.stdout for r in result.results if r.ok})
    log = last_attempt(log)
    said = from_mpirun_log(log)
    if said is not None and said.get("kind") == "lost":  # mpirun lost a node's daemon: that node went first
        found.append({"kind": "lost", "address": said["address"], "time": 0.0})
    for r in result.failed():  # a node of the job that does not answer now: gone (its peers failed of it)
        found.append({"kind": "lost", "node": r.node, "time": 0.0, "what": f"does not answer: {r.reason}"})
    failure = first(found)
    if failure is not None and failure.get("address"):
        node = next((n.name for n in cluster.nodes if failure["address"] in (n.address, n.name)), failure["address"])
        return {"kind": "lost", "node": node, "what": failure.get("what") or "mpirun lost its daemon there"}
    if failure is None:
        if said is None:
            return {"unknown": True}
        failure = dict(said, node=where.get(said["rank"]), kind="failure")
    if failure.get("rank") is not None and not failure.get("tail") and failure.get("node"):
        failure["tail"] = _tail(session, job, failure["node"], int(failure["rank"]))
    return failure
