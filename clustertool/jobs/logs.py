"""`clustertool logs JOB [-f] [--node NODE]`: the job's log from the leader.

Ranks' lines carry Open MPI's ``--tag-output`` prefix ``[jobid,rank]<stream>:``; with
``--node`` only the ranks that ran on that node are shown (the rank -> node map comes from
the rank wrappers' records on each node).
"""

from __future__ import annotations

import re
from typing import Callable

from clustertool import state
from clustertool.errors import ToolError
from clustertool.jobs import records, scripts
from clustertool.jobs.launch import follow
from clustertool.jobs.mpirun import JOBS_DIR
from clustertool.model import Cluster, Job
from clustertool.remote.group import run_on_node
from clustertool.remote.transport import SSH, Transport

TAG_RE = re.compile(r"^\[(\d+),(\d+)\]<(stdout|stderr)>:")


def find_job(cluster_name: str, ref: str, refresh: bool = True, transport: Transport = SSH) -> tuple[Cluster, Job]:
    cluster = state.load(cluster_name)
    jobs = records.refresh(cluster, transport=transport) if refresh else records.load_all(cluster.name)
    return cluster, records.resolve(jobs, ref)


def ranks_on(cluster: Cluster, job: Job, node_name: str, transport: Transport = SSH) -> set[int]:
    """Ranks of ``job`` that ran on ``node_name`` (from its rank records there)."""
    node = cluster.node(node_name)
    d = f'"$HOME/{JOBS_DIR}/{scripts.check_id(job.id)}/ranks"'
    result = run_on_node(cluster.name, node, f'ls {d} 2>/dev/null | grep "^$(uname -n)\\." || true', timeout=20,
                         transport=transport)
    ranks = set()
    for name in result.stdout.split():
        tail = name.rsplit(".", 1)[-1]
        if tail.isdigit():
            ranks.add(int(tail))
    return ranks


def line_filter(ranks: set[int] | None) -> Callable[[str], bool]:
    """Keep lines of these ranks (None: keep all); untagged lines (mpirun's own) are kept."""
    if ranks is None:
        return lambda line: True

    def keep(line: str) -> bool:
        m = TAG_RE.match(line)
        return m is None or int(m.group(2)) in ranks

    return keep


def show(cluster_name: str, ref: str, on_line: Callable[[str], None], *, follow_log: bool = False,
         node: str | None = None, lines: int | None = None, transport: Transport = SSH) -> int | None:
    """Print the log (or follow it); returns the exit code when following to the end."""
    cluster, job = find_job(cluster_name, ref, transport=transport)
    keep = line_filter(ranks_on(cluster, job, node, transport) if node else None)

    def emit(text: str) -> None:
        if keep(text):
            on_line(text)

    if follow_log:
        start = 1
        if lines:
            count = run_on_node(cluster.name, cluster.node(job.leader),
                                f'wc -l < "$HOME/{JOBS_DIR}/{job.id}/log"', timeout=20,
                                transport=transport).stdout.strip()
            start = max(1, int(count or 0) - lines + 1) if count.isdigit() else 1
        return follow(cluster.name, job, emit, from_line=start, transport=transport)
    result = run_on_node(cluster.name, cluster.node(job.leader), scripts.tail_script(job.id, lines), timeout=60,
                         transport=transport)
    if not result.ok:  # the node answered but has no log: it was cleaned away
        why = result.reason if result.error else "it was removed (`clustertool clean`)"
        raise ToolError(f"no log for job {job.id} on {job.leader}: {why}")
    for text in result.stdout.splitlines():
        emit(text)
    return None
