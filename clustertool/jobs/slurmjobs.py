"""The Slurm side of `jobs` and `kill`: the cluster's queue as Slurm sees it (every user's jobs), and a
cancel that waits until Slurm let the job go.

`jobs` lists this machine's jobs (records.refresh) and, beside them, Slurm's queue: pending jobs with
Slurm's reason (Resources, Priority, Dependency, ReqNodeNotAvail ...) and who submitted them, other
people's jobs too.  `kill` of a Slurm job is ``scancel`` (Slurm signals every step, then KILLs after its
KillWait), then ``squeue`` until the job is gone, then the usual check on its nodes that nothing of it
is left (jobs/kill.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import RemoteError
from clustertool.core.model import JobRecord
from clustertool.jobs import records, scripts
from clustertool.remote.group import run_on_node
from clustertool.slurm import bringup, slurmcmd, slurminfo, slurmtext
from clustertool.slurm.slurminfo import SlurmInfo
from clustertool.slurm.slurmtext import QueuedJob


@dataclass
class QueueRow:
    """One job of Slurm's queue, with this machine's job id where it is one of ours."""

    slurm: QueuedJob
    job: str | None  # clustertool's id

    def to_dict(self) -> dict:
        q = self.slurm
        return {"slurm_id": q.id, "job": self.job, "state": q.state, "reason": q.reason, "user": q.user,
                "nodes": q.nodes, "nodelist": q.nodelist, "name": q.name, "submitted": q.submitted}


def _slurm(session: ClusterSession, found: SlurmInfo, argv: list[str], timeout: float = 30) -> str:
    result = bringup.run_slurm(session, session.record.leader, found.layout, argv, timeout)
    if not result.ok:
        raise RemoteError(f"{argv[0]} failed on {result.node}: {result.reason}")
    return result.stdout


def queue(session: ClusterSession, jobs: list[JobRecord] | None = None) -> list[QueueRow]:
    """Slurm's queue now, every user's (``jobs``: this machine's records, to name ours)."""
    found = slurminfo.of(session.record)
    if found is None or not found.ready:
        return []
    by_slurm = {str((j.slurm or {}).get("id")): j.id for j in jobs or [] if j.slurm}
    rows = slurmtext.squeue_jobs(_slurm(session, found, slurmcmd.squeue_argv()))
    return [QueueRow(q, by_slurm.get(q.id)) for q in rows]


def cancel(session: ClusterSession, job: JobRecord, signal: str = "TERM", grace: float = 10.0) -> str:
    """Mark the job killed on the leader (no requeue after this), scancel it, and wait until Slurm no
    longer runs it.  Returns Slurm's last word on it (its state)."""
    found = slurminfo.require(session.record, "kill")
    slurm_id = str((job.slurm or {}).get("id"))
    leader = session.record.node(job.leader)
    run_on_node(session, leader, f'mkdir -p {scripts.job_dir_sh(job.id)} && touch {scripts.job_dir_sh(job.id)}/killed',
                timeout=20)
    argv = slurmcmd.scancel_argv([slurm_id], None if signal == "TERM" else signal)
    _slurm(session, found, argv)
    if signal not in ("TERM", "KILL", "INT"):  # a signal of its own (USR1 ...): the job goes on
        return "signalled"
    deadline = time.monotonic() + grace + 60
    while True:
        left = slurmtext.squeue_jobs(_slurm(session, found, slurmcmd.squeue_argv([slurm_id])))
        live = [q for q in left if q.state not in ("COMPLETED", "CANCELLED", "FAILED")]
        if not live:
            wait_waiter(session, job)
            return "cancelled"
        if time.monotonic() > deadline:
            return f"still {live[0].state} in Slurm"
        if time.monotonic() > deadline - 60 + grace:
            _slurm(session, found, slurmcmd.scancel_argv([slurm_id], "KILL"))
        time.sleep(0.5)


def wait_waiter(session: ClusterSession, job: JobRecord, timeout: float = 20.0) -> bool:
    """Until the leader's waiter wrote the job's end (its exit file), once Slurm let the job go."""
    leader = session.record.node(job.leader)
    deadline = time.monotonic() + timeout
    while not run_on_node(session, leader, f"test -f {scripts.job_dir_sh(job.id)}/exit", timeout=20).ok:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def refresh(session: ClusterSession) -> tuple[list[JobRecord], list[QueueRow]]:
    """This machine's jobs and Slurm's queue (empty where the cluster has no Slurm)."""
    jobs = records.refresh(session)
    return jobs, queue(session, jobs)
