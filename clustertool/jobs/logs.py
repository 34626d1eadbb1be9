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
from clustertool.jobs import output, records


def find_job(session: ClusterSession, ref: str, refresh: bool = True) -> tuple[ClusterRecord, JobRecord]:
    cluster = session.reload()
    jobs = records.refresh(session) if refresh else records.load_all(cluster.name)
    return cluster, records.resolve(jobs, ref)


def parse_ranks(text: str | None) -> set[int] | None:
    """``--rank``: "3", "0,2" or "4-7" (None: every rank)."""
    if text is None:
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"--rank {text!r}: use a rank, a list or a range, e.g. 0, 0,3 or 4-7")
        ranks.update(range(int(lo), int(hi if sep else lo) + 1))
    return ranks


def show(session: ClusterSession, ref: str, on_line: Callable[[str], None], *, follow_log: bool = False,
         node: str | None = None, rank: str | None = None, lines: int | None = None,
         warn: Callable[[str], None] = lambda _t: None, attempt: int | None = None) -> int | None:
    """Print the job's lines (or follow them); returns the exit code when following to the end.
    ``attempt``: a job run with --restarts, only that attempt's rank lines (1: the first)."""
    ranks = parse_ranks(rank)
    cluster, job = find_job(session, ref)
    if node is not None:
        cluster.node(node)  # an unknown node is a clear error
    if attempt is not None:
        if follow_log:
            raise UsageError("--attempt shows one attempt as it is: leave out -f (which follows every attempt)")
        known = len(job.attempts) or 1
        if not 1 <= attempt <= known:
            raise UsageError(f"job {job.id} has no attempt {attempt}",
                             hint=f"its attempts: 1-{known}" if known > 1 else "it ran once (attempt 1)")
    return job_lines(session, job, on_line, follow=follow_log, ranks=ranks, node=node, tail=lines, warn=warn,
                     attempt=attempt)


def job_lines(session: ClusterSession, job: JobRecord, on_line: Callable[[str], None], *, follow: bool = False,
              ranks: set[int] | None = None, node: str | None = None, tail: int | None = None,
              warn: Callable[[str], None] = lambda _t: None, attempt: int | None = None) -> int | None:
    """The job's lines (following: until it ends, then its exit code)."""
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
