"""`clustertool stragglers JOB`: the workers that made the others wait, with their p50/p99 lateness.

With reduction servers, each reducer writes its sessions' lateness records in the job's folder on its server
(``stragglers/*.jsonl``, written by the reducer; nodeprogs/watchlate.py reads them): the last line of each file
is read over ssh, the records merged, and the workers sorted by how long the others waited for them alone.
Without servers, the plugin's own per-rank wait (``collnet-stats.jsonl`` in the job's folder on each rank's node:
its CollNet stats, one line per rank when the communicator closes) is what can be measured: the rank that waited
least is the one the others waited for.  A job with neither says so.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import ClusterRecord, JobRecord, jsonable
from clustertool.jobs import records
from clustertool.jobs.kill import pick_running
from clustertool.jobs.reducers import STATS_FILE
from clustertool.nodeprogs import watchlate
from clustertool.remote.group import run_on_nodes


@dataclass
class WorkerLateness:
    """One worker (a rank of the CollNet communicator; under NCCL one per node) as the reducers saw it."""

    worker: str
    node: str | None
    peer: str | None
    requests: int
    last_share: float | None  # share of requests its data came last in
    waited_for_s: float  # what the others spent waiting for it alone
    p50_ms: float | None  # its lateness after the first worker's data
    p99_ms: float | None
    straggler: bool


@dataclass
class StragglerReport:
    """``source``: "servers" (the reducers' records), "collnet-stats" (the plugin's per-rank wait, no servers) or
    "none"; ``workers`` most waited-for first; ``note``: what the numbers are, or why there are none."""

    job: str
    source: str
    workers: list[WorkerLateness] = field(default_factory=list)
    note: str | None = None
    files: list[str] = field(default_factory=list)

    @property
    def stragglers(self) -> list[WorkerLateness]:
        return [w for w in self.workers if w.straggler]

    def to_dict(self) -> dict[str, Any]:
        return dict(jsonable(self), stragglers=[w.worker for w in self.stragglers])


def read_script(job_id: str) -> str:
    """Any node of the job: ``LATE <file> <its last line>`` per lateness record, ``STATS <line>`` per CollNet stats
    line."""
    d = f'"$HOME"/{shlex.quote(JOBS_DIR)}/{shlex.quote(job_id)}'
    return "\n".join([
        f'for f in {d}/stragglers/*.jsonl; do [ -f "$f" ] || continue; '
        'printf "LATE %s " "$(basename "$f")"; tail -n 1 "$f"; done',
        f'[ -f {d}/{STATS_FILE} ] && sed "s/^/STATS /" {d}/{STATS_FILE}',
        "true", ""])


def parse(stdout: str) -> tuple[dict[str, dict], list[dict]]:
    """({record file: its last line}, [CollNet stats lines]); lines that are not JSON are left out."""
    late, stats = {}, []
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        try:
            if kind == "LATE":
                name, _, text = rest.partition(" ")
                late[name] = json.loads(text)
            elif kind == "STATS":
                stats.append(json.loads(rest))
        except ValueError:
            continue
    return late, stats


def from_records(job: JobRecord, docs: dict[str, dict], cluster: ClusterRecord) -> StragglerReport:
    workers, bounds = watchlate.merge(docs.values())
    nodes = [[n.name, n.address, n.role] for n in cluster.nodes]
    rows = [WorkerLateness(r["worker"], watchlate.node_of(r["peer"], nodes), r["peer"], r["requests"],
                           r["last_share"], round(r["waited_for_us"] / 1e6, 3), _ms(r["p50_us"]), _ms(r["p99_us"]),
                           r["straggler"]) for r in watchlate.summary(workers, bounds)]
    final = all(d.get("final") for d in docs.values())
    note = (f"from {len(docs)} reducer record(s){'' if final else ' (the job runs: as of their last second)'}; "
            "lateness: a worker's data after the first worker's, per request, at the reducers")
    return StragglerReport(job.id, "servers", rows, note, sorted(docs))


def from_stats(job: JobRecord, stats: list[tuple[str, dict]]) -> StragglerReport:
    """Without servers: each rank's wait from post to done (the plugin's CollNet stats); the one that waited least,
    by LATE_RATIO and at least LATE_FLOOR_US, is the one the others waited for."""
    by_rank: dict[int, dict] = {}
    where: dict[int, str | None] = {}
    for node, s in stats:
        if isinstance(s, dict) and isinstance(s.get("rank"), int):
            by_rank[s["rank"]] = s
            where[s["rank"]] = node if where.get(s["rank"], node) == node else None  # a shared home: not known
    waits = [s.get("post_to_done_p50_us") or 0.0 for s in by_rank.values()]
    typical = watchlate.median(waits) or 0.0
    rows = []
    for rank, s in sorted(by_rank.items(), key=lambda kv: kv[1].get("post_to_done_p50_us") or 0.0):
        own = float(s.get("post_to_done_p50_us") or 0.0)
        flag = len(by_rank) >= 2 and typical - own >= watchlate.LATE_FLOOR_US and own * 2 <= typical
        rows.append(WorkerLateness(str(rank), where.get(rank), None, int(s.get("requests") or 0), None,
                                   round(max(0.0, typical - own) * int(s.get("requests") or 0) / 1e6, 3),
                                   _ms(own), _ms(s.get("post_to_done_p99_us")), flag))
    algo = next((s.get("algo") for s in by_rank.values()), "?")
    note = (f"no reduction servers: the plugin's own wait per rank ({algo}, CollNet stats at communicator close); "
            "p50/p99 here are each rank's wait from post to done, and the rank that waited least is the one the "
            "others waited for (waited-for: the others' median wait less its own, times its requests)")
    return StragglerReport(job.id, "collnet-stats", rows, note)


def _ms(us: float | None) -> float | None:
    return None if us is None else round(us / 1000.0, 3)


def fetch(session: ClusterSession, ref: str | None) -> StragglerReport:
    """The job's stragglers (``ref``: id, prefix or name; None: the one running job)."""
    cluster = session.ready()
    known = records.refresh(session)
    job = records.resolve(known, ref) if ref else pick_running(known, None)
    names = set(job.servers) | set(job.nodes)
    nodes = [n for n in cluster.ordered_nodes() if n.name in names]
    result = run_on_nodes(session, nodes, "sh -s", timeout=60, stdin_data=read_script(job.id).encode())
    late: dict[str, dict] = {}
    stats: list[tuple[str, dict]] = []
    for r in result.results:
        if r.ok:
            docs, lines = parse(r.stdout)
            late.update({f"{r.node}/{k}": v for k, v in docs.items()})
            stats += [(r.node, line) for line in lines]
    unanswered = [r.node for r in result.results if not r.ok]
    if late:
        report = from_records(job, late, cluster)
    elif stats:
        report = from_stats(job, stats)
    else:
        report = StragglerReport(job.id, "none", note=_none_note(job))
    if unanswered:
        report.note = f"{report.note}; {nodeset.fold(unanswered)} did not answer"
    return report


def _none_note(job: JobRecord) -> str:
    if job.servers:
        return ("its reduction servers left no lateness record (a reducer from before the record, or the job ended "
                "before its first second of traffic)")
    return ("it ran without reduction servers and left no CollNet stats: stragglers are measured for `run --plugin` "
            "jobs (with servers: the reducers' lateness; without: the plugin's own wait per rank, written when the "
            "communicator closes)")
