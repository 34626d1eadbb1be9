"""Following a job to its end (`run --follow`, `logs -f`, ``Job.follow``), with its recovery loop beside.

A job run with --replace-failed waits on its leader for a lost node's replacement, which only a
machine with the cloud credentials can make: ``follow(..., recover=True)`` runs that loop in a thread
(jobs/recovery.py) while this one streams the job's lines.  When the leader itself was lost, the
stream went with it; the loop starts the job again on the new leader and the stream follows it there.
"""

from __future__ import annotations

from typing import Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.core.model import JobRecord
from clustertool.jobs import failure, logs, records
from clustertool.jobs.recovery import alongside

LineFn = Callable[[str], None]


def stream(session: ClusterSession, job: JobRecord, on_line: LineFn, *, warn: LineFn | None = None,
           ranks: set[int] | None = None, node: str | None = None) -> int | None:
    """Hand the job's lines to ``on_line`` until it ends; its exit code (None: ended without one)."""
    session.reload()
    return logs.job_lines(session, job, on_line, follow=True, ranks=ranks, node=node,
                          warn=warn or (lambda _t: None))


def follow(session: ClusterSession, job: JobRecord, on_line: LineFn, *, warn: LineFn | None = None,
           recover: bool = False, ranks: set[int] | None = None, node: str | None = None) -> int | None:
    """Stream the job until it ends; its exit code (None: killed or lost without one).  ``recover``: a job
    run with --replace-failed has its recovery loop run here beside the stream (progress lines: the
    session's reporter; what stopped the loop: ``warn``, default the reporter too)."""
    warn = warn or session.report
    if not (recover and job.replace_failed):
        return stream(session, job, on_line, warn=warn, ranks=ranks, node=node)
    with alongside(session, job.id, warn) as beside:
        code = stream(session, job, on_line, warn=warn, ranks=ranks, node=node)
        while code is None and beside.started_again():  # a new leader: the stream went with the old one
            code = stream(session, job, on_line, warn=warn, ranks=ranks, node=node)
    return code


def why_failed(session: ClusterSession, job_id: str) -> str | None:
    """After a followed job failed: ``job ID failed: <the rank (or node) that failed first>`` (where nothing
    more is known: ``job ID failed (exit N)``), or None (a job that succeeded or was killed by the user)."""
    try:
        job = records.resolve(records.refresh(session), job_id)
    except ToolError:
        return None
    if job.state == "killed" or not job.finished or job.state == "succeeded":
        return None
    why = failure.text(job.failure)
    code = f" (exit {job.exit_code})" if job.exit_code is not None else ""
    return f"job {job_id} {job.state}: {why}" if why else f"job {job_id} {job.state}{code}"
