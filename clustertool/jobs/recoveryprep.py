"""What `run` prepares for a job's recovery, light enough for the run path (jobs/launch.py imports it; the
recovery loop itself is jobs/recovery.py): the signal a spot notice sends (``preempt_signal``), the leader's
spot-notice watcher (``spot_program``), and what a lost leader's job is started again from: the launch files
`run` sent (``keep_launch``) and its request (``keep_request``, jobs/replan.py plans the job again from it).
Both kept in this home's jobs folder, 0600, for jobs run with --replace-failed only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from clustertool.core.errors import UsageError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import ClusterRecord, JobRecord
from clustertool.jobs import records
from clustertool.jobs.jobplan import JobPlan
from clustertool.jobs.jobrequests import (
    HangPolicy,
    HorovodKnobs,
    LaunchOptions,
    RecoveryPolicy,
    RestartPolicy,
    RunRequest,
    SyncPolicy,
)
from clustertool.nodeprogs import program_text

IMDS_ENV = "CLUSTERTOOL_IMDS_URL"  # only tests set it: the metadata's base URL ({node}: the node's name)
IMDS_URL = "http://169.254.169.254"
SPOT_POLL_S = 2.0  # how often each node asks its metadata for a notice
SPOT_GRACE_S = 30.0  # after the signal, how long the ranks get before mpirun is stopped

def preempt_signal(cluster: ClusterRecord, policy: RecoveryPolicy) -> str | None:
    """The signal a spot notice sends the job's ranks: spot notices are watched on spot clusters (and where
    a test points the metadata elsewhere), TERM unless run --on-preempt-signal says otherwise; None
    where nothing watches.  A signal asked for on a cluster that gets no notices is refused."""
    watched = bool(cluster.options.get("spot")) or bool(os.environ.get(IMDS_ENV))
    if policy.on_preempt_signal and not watched:
        raise UsageError(f"--on-preempt-signal: cluster {cluster.name!r} is not made of spot instances: "
                         "no notice comes", hint="leave it out (spot clusters: `up --spot`)")
    return (policy.on_preempt_signal or "TERM") if watched else None


def spot_program(plan: JobPlan, job: JobRecord) -> bytes | None:
    """The leader's spot-notice watcher for the job (nodeprogs/spot.py), where notices are watched."""
    if not job.on_preempt_signal:
        return None
    return program_text("spot", {"job_dir": f"{plan.home}/{JOBS_DIR}/{plan.job_id}", "job": plan.job_id,
                                 "nodes": [[n.name, n.address] for n in plan.nodes],
                                 "url": os.environ.get(IMDS_ENV) or IMDS_URL, "interval": SPOT_POLL_S,
                                 "signal": job.on_preempt_signal, "grace": SPOT_GRACE_S})


def launch_path(job: JobRecord) -> Path:
    return records.jobs_dir(job.cluster) / f"{job.id}.launch"


def keep_launch(job: JobRecord, script: str) -> None:
    """What `run` sent the leader to start a job with --replace-failed (its files, then the start), kept here."""
    if not job.replace_failed:
        return
    path = launch_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(script)


def request_path(job: JobRecord) -> Path:
    return records.jobs_dir(job.cluster) / f"{job.id}.request.json"


def to_doc(request: RunRequest) -> dict[str, Any]:
    return dataclasses.asdict(request)


def from_doc(doc: dict[str, Any]) -> RunRequest:
    """The request :func:`to_doc` wrote (checked again as it is made)."""
    launch = dict(doc.get("launch") or {})
    launch["horovod"] = HorovodKnobs(**(launch.get("horovod") or {}))
    launch["env"], launch["mpi_args"] = tuple(launch.get("env") or ()), tuple(launch.get("mpi_args") or ())
    restarts = dict(doc.get("restarts") or {})
    codes = restarts.get("exit_codes")
    sync = doc.get("sync")
    return RunRequest(command=tuple(doc["command"]), nodes=doc.get("nodes"), name=doc.get("name"),
                      launch=LaunchOptions(**launch), plugin=bool(doc.get("plugin")),
                      sync=SyncPolicy(**sync) if sync else None, allow_concurrent=bool(doc.get("allow_concurrent")),
                      hang=HangPolicy(**(doc.get("hang") or {})),
                      restarts=RestartPolicy(int(restarts.get("count") or 0), None if codes is None else tuple(codes)),
                      recovery=RecoveryPolicy(**(doc.get("recovery") or {})), after=doc.get("after"),
                      record=bool(doc.get("record", True)), checkpoint_dir=doc.get("checkpoint_dir"))


def keep_request(job: JobRecord, request: RunRequest) -> None:
    """What a new leader needs to plan the job again (jobs run with --replace-failed only)."""
    if not job.replace_failed:
        return
    path = request_path(job)
    records.jobs_dir(job.cluster).mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(to_doc(request), fh)


def kept_request(job: JobRecord) -> RunRequest | None:
    try:
        with open(request_path(job)) as fh:
            return from_doc(json.load(fh))
    except (OSError, ValueError, TypeError, KeyError):
        return None
