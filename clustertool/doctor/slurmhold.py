"""doctor's measurements inside a Slurm allocation: on a Slurm cluster the network search (bisection) and the
MPI smoke test run while a job of the user holds their nodes, so that no other job shares the links they
measure, and on sites that admit SSH only where one has a job (pam_slurm_adopt) the nodes let them in.

The hold is ``sbatch --wrap 'sleep ...'`` on exactly those nodes (``--exclusive``); when Slurm does not
grant it within ``WAIT_S`` (the nodes run other jobs), the check is skipped and says why, rather than
measuring links that other jobs load.  The hold is cancelled however the check ends.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.model import Node
from clustertool.doctor.findings import CheckResult, Finding
from clustertool.slurm import bringup, slurmcmd, slurminfo, slurmtext

WAIT_S = 60.0
HOLD_S = 6 * 3600  # the hold's own end, should doctor be killed before it cancels it


class Busy(Exception):
    """Slurm did not give doctor the nodes in time."""


def _run(session: ClusterSession, found: slurminfo.SlurmInfo, argv: list[str]) -> str:
    result = bringup.run_slurm(session, session.record.leader, found.layout, argv, timeout=30)
    if not result.ok:
        raise Busy(f"{argv[0]} failed: {result.reason}")
    return result.stdout


@contextmanager
def held(session: ClusterSession, nodes: list[Node], what: str, wait_s: float = WAIT_S) -> Iterator[str | None]:
    """Slurm's job id holding the Slurm nodes among ``nodes`` while the block runs (None: no Slurm here)."""
    found = slurminfo.of(session.record)
    names = [n.name for n in nodes if found is not None and n.name in found.nodes]
    if found is None or not found.ready or not names:
        yield None
        return
    spec = slurmcmd.BatchSpec(wrap=f"sleep {HOLD_S}", nodes=len(names), nodelist=found.slurm_names(names),
                              job_name=f"clustertool-doctor-{what}", output="/dev/null", partition=found.partition,
                              extra=("--overcommit",))
    job = _run(session, found, slurmcmd.sbatch_argv(spec)).strip().split(";")[0]
    try:
        deadline = time.monotonic() + wait_s
        while True:
            queued = slurmtext.squeue_jobs(_run(session, found, slurmcmd.squeue_argv([job])))
            if queued and queued[0].state == "RUNNING":
                break
            if time.monotonic() > deadline:
                why = queued[0].reason if queued else "it left the queue"
                raise Busy(f"Slurm did not give {nodeset.fold(found.slurm_names(names))} to doctor within "
                           f"{wait_s:.0f}s ({why}): other jobs run there")
            time.sleep(0.5)
        session.report(f"{what}: inside Slurm job {job} (holding {nodeset.fold(found.slurm_names(names))})")
        yield job
    finally:
        bringup.run_slurm(session, session.record.leader, found.layout, slurmcmd.scancel_argv([job]), timeout=30)


def inside(session: ClusterSession, nodes: list[Node], name: str,
           check: Callable[[], CheckResult | list[Finding]]) -> CheckResult:
    """``check`` inside an allocation of ``nodes`` (skipped, saying why, when Slurm does not give them)."""
    try:
        with held(session, nodes, name) as job:
            found = check()
            result = found if isinstance(found, CheckResult) else CheckResult(name, list(found))
            if job is not None:
                result.data = {**result.data, "slurm_hold": job}
            return result
    except Busy as exc:
        return CheckResult(name, skipped=str(exc))
