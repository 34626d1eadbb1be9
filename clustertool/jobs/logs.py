"""`clustertool logs JOB [-f] [--rank R] [--node NODE] [--tail N]`: a job's output in whole lines.

Lines read ``[job,rank]<stream>:text`` (bare with ``run --no-tag-output``); mpirun's own lines
carry no tag.  ``--rank`` keeps those ranks' lines only; ``--node`` keeps the lines of the ranks
that ran on that node and mpirun's own.  How the lines are read: jobs/output.py.
"""

from __future__ import annotations

from typing import Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, JobRecord
from clustertool.jobs import output, records, slurmrun
from clustertool.jobs.jobrequests import LogsRequest


def find_job(session: ClusterSession, ref: str | None, refresh: bool = True, *,
             running: bool = False) -> tuple[ClusterRecord, JobRecord]:
    """The job ``ref`` names (id, unique prefix or name); None: the latest (``running``: the latest running),
    said on the session's reporter."""
    cluster = session.reload()
    jobs = records.refresh(session) if refresh else records.load_all(cluster.name)
    if ref is not None:
        return cluster, records.resolve(jobs, ref)
    job = records.latest(jobs, cluster.name, running=running)
    session.report(records.picked_line(job, len(jobs) - 1))
    return cluster, job


def show(session: ClusterSession, request: LogsRequest, on_line: Callable[[str], None], *,
         warn: Callable[[str], None] = lambda _t: None) -> int | None:
    """Hand the job's lines to ``on_line`` (or follow them); the exit code when following to the end."""
    cluster, job = find_job(session, request.job)
    if request.node is not None:
        cluster.node(request.node)  # an unknown node is a clear error
    if request.attempt is not None:
        known = len(job.attempts) or 1
        if not 1 <= request.attempt <= known:
            raise UsageError(f"job {job.id} has no attempt {request.attempt}",
                             hint=f"its attempts: 1-{known}" if known > 1 else "it ran once (attempt 1)")
    return job_lines(session, job, on_line, follow=request.follow, ranks=request.rank_set, node=request.node,
                     tail=request.tail, warn=warn, attempt=request.attempt)


def job_lines(session: ClusterSession, job: JobRecord, on_line: Callable[[str], None], *, follow: bool = False,
              ranks: set[int] | None = None, node: str | None = None, tail: int | None = None,
              warn: Callable[[str], None] = lambda _t: None, attempt: int | None = None) -> int | None:
    """The job's lines (following: until it ends, then its exit code)."""
    if follow and job.slurm and job.state == "pending":  # its nodes are Slurm's to choose: known once it runs
        job = slurmrun.wait_started(session, job.id, report=warn)
    if job.output_dir is None:  # a job from before per-rank files: the leader's log
        wanted = ranks
        if node is not None:
            on_node = output.legacy_ranks_on(session, job, node)
            wanted = on_node if ranks is None else on_node & ranks
        keep = output.legacy_filter(wanted, untagged=ranks is None)
        output.legacy_show(session, job, on_line, follow=follow, keep=keep, lines=tail)
    elif follow:
        output.follow_lines(session, job, on_line, ranks=ranks, node=node, tail=tail, warn=warn)
    else:
        output.read(session, job, on_line, ranks=ranks, node=node, tail=tail, warn=warn, attempt=attempt)
    return output.exit_code(session, job) if follow else None
