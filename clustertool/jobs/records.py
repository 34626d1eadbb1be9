"""Job records: the leader's job directories are the truth, local state is a cache.

Local records live in ``$CLUSTERTOOL_HOME/clusters/<cluster>/jobs/<id>.json`` (written
atomically).  ``refresh`` asks the leader once for every job directory's state and merges.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import UsageError
from clustertool.core.model import JobRecord
from clustertool.jobs import failure, scripts
from clustertool.remote.group import run_on_node
from clustertool.slurm import slurminfo
from clustertool.slurm.slurminfo import SlurmInfo


def new_id() -> str:
    return f"j{time.strftime('%m%d')}-{secrets.token_hex(3)}"


def jobs_dir(cluster_name: str) -> Path:
    return state.cluster_dir(cluster_name) / "jobs"


def reports_dir(cluster_name: str) -> Path:
    """Where the end-of-job reports of `run --follow` go (``<job>.html``, ``<job>.png``); `clean --jobs` empties it."""
    return state.cluster_dir(cluster_name) / "reports"


def save(job: JobRecord) -> None:
    d = jobs_dir(job.cluster)
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{job.id}.", suffix=".tmp", dir=d)
    with os.fdopen(fd, "w") as fh:
        json.dump(job.to_dict(), fh, indent=2, sort_keys=True)
    os.replace(tmp, d / f"{job.id}.json")


def forget(cluster_name: str, job_id: str) -> None:
    (jobs_dir(cluster_name) / f"{job_id}.json").unlink(missing_ok=True)
    for suffix in (".html", ".png"):
        (reports_dir(cluster_name) / f"{job_id}{suffix}").unlink(missing_ok=True)


def load_all(cluster_name: str) -> list[JobRecord]:
    d = jobs_dir(cluster_name)
    jobs = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            jobs.append(JobRecord.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(jobs, key=lambda j: j.started)


def latest(jobs: list[JobRecord], cluster: str, *, running: bool = False) -> JobRecord:
    """The job started last (``running``: of those still running): what `logs` and `attach` take without a JOB."""
    pool = [j for j in jobs if j.state == "running"] if running else list(jobs)
    if not pool:
        what = "running job" if running else "job"
        hint = (f"`clustertool jobs -c {cluster}` lists its jobs" if jobs and running
                else f"start one: clustertool run -c {cluster} -- python train.py")
        raise UsageError(f"no {what} on cluster {cluster!r}", hint=hint)
    return max(pool, key=lambda j: j.started)


def picked_line(job: JobRecord, others: int) -> str:
    """What a command says when it took the latest job itself."""
    when = time.strftime("%H:%M:%S", time.localtime(job.started))
    rest = f"; {others} other{'s' if others != 1 else ''}: `clustertool jobs`" if others else ""
    return f"job {job.id} ({job.state}, started {when}: the latest{rest})"


def resolve(jobs: list[JobRecord], ref: str) -> JobRecord:
    """A job by exact id, unique id prefix, or name (the newest of that name)."""
    for job in jobs:
        if job.id == ref:
            return job
    prefixed = [j for j in jobs if j.id.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    named = [j for j in jobs if j.name == ref]
    if named:
        return named[-1]
    if len(prefixed) > 1:
        raise UsageError(f"job {ref!r} is ambiguous: {', '.join(j.id for j in prefixed)}")
    if not jobs:
        raise UsageError(f"no job {ref!r} on this cluster: it has none yet",
                         hint="`clustertool run -- python train.py` starts one")
    known = ", ".join(j.id for j in jobs[-5:])
    raise UsageError(f"no job {ref!r} on this cluster", hint=f"recent jobs: {known} (see `clustertool jobs`)")


def derive_state(code: str, alive: bool, killed: bool, launched: bool, started: float,
                 now: float | None = None, pending_s: float = 30.0) -> tuple[str, int | None]:
    """(state, exit code) from what the leader's job directory shows."""
    now = time.time() if now is None else now
    exit_code = int(code) if code.lstrip("-").isdigit() and code != "-" else None
    if exit_code is not None:
        if killed:
            return "killed", exit_code
        return ("succeeded" if exit_code == 0 else "failed"), exit_code
    if alive:
        return "running", None
    if killed:
        return "killed", None
    if not launched and now - started < pending_s:
        return "running", None  # launch.sh has not written its pid yet
    return "lost", None


def parse_status(output: str) -> dict[str, tuple[str, bool, bool, bool, float | None, dict | None]]:
    """id -> (exit code text, alive, killed, launched, ended epoch, leader's job.json)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) < 7 or parts[0] != "J":
            continue
        record = _b64_json(parts[7]) if len(parts) >= 8 else None
        ended = float(parts[6]) if parts[6].isdigit() and parts[6] != "0" else None
        out[parts[1]] = (parts[2], parts[3] == "1", parts[4] == "1", parts[5] == "1", ended, record)
    return out


def parse_lost(output: str) -> dict[str, list[str]]:
    """Job id -> the reduction servers its launch script found gone at the end (``S ID A,B`` lines)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "S":
            out[parts[1]] = [n for n in parts[2].split(",") if n]
    return out


def parse_hung(output: str) -> dict[str, dict]:
    """Job id -> what its supervisor wrote when it found the job hung (``H ID B64`` lines)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "H" and isinstance(doc := _b64_json(parts[2]), dict):
            out[parts[1]] = doc
    return out


def parse_attempts(output: str) -> dict[str, dict]:
    """Job id -> its restart loop's attempts.json (``R ID B64`` lines: jobs run with --restarts)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "R" and isinstance(doc := _b64_json(parts[2]), dict):
            out[parts[1]] = doc
    return out


def parse_block_end(output: str) -> dict[str, dict]:
    """Job id -> what the leader's watcher sent it before the block's end (``B ID B64`` lines)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "B" and isinstance(doc := _b64_json(parts[2]), dict):
            out[parts[1]] = doc
    return out


def parse_slurm(output: str) -> dict[str, dict]:
    """Job id -> its Slurm waiter's slurm.json (``L ID B64`` lines: jobs run through Slurm)."""
    out = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "L" and isinstance(doc := _b64_json(parts[2]), dict):
            out[parts[1]] = doc
    return out


def take_slurm(job: JobRecord, doc: dict, info: SlurmInfo | None) -> None:
    """What the leader's waiter says of a Slurm job: its state, reason, nodes (ours), attempts; a job still in
    the queue is ``pending``."""
    job.slurm = {**(job.slurm or {}), **doc}
    slurm_nodes = [str(n) for n in doc.get("nodes") or []]
    if slurm_nodes:
        ours = [info.node_of(n) or n for n in slurm_nodes] if info is not None else slurm_nodes
        job.nodes = [n for n in dict.fromkeys([*job.nodes, *ours])]
    job.attempts = [{k: a.get(k) for k in ("attempt", "start", "end", "code", "cause")}
                    for a in doc.get("attempts") or [] if isinstance(a, dict)]
    if job.state in ("running", "pending"):  # (no state written yet: it was just queued)
        job.state = "pending" if doc.get("state", "PENDING") in ("PENDING", "REQUEUED", "CONFIGURING") else "running"


def _b64_json(text: str) -> Any:
    """The JSON document a leader's line carries in base64 (None when it is not one)."""
    try:
        return json.loads(base64.b64decode(text))
    except (binascii.Error, ValueError):
        return None


def refresh(session: ClusterSession, timeout: float = 20.0) -> list[JobRecord]:
    """Ask the leader for every job's state; merge into local records; return all jobs.

    When the leader cannot be reached, the local records are returned as they are.
    """
    cluster = session.record
    local = {j.id: j for j in load_all(cluster.name)}
    result = run_on_node(session, cluster.leader, "sh -s", timeout=timeout,
                         stdin_data=scripts.status_script().encode())
    if not result.ok:
        return sorted(local.values(), key=lambda j: j.started)
    now = time.time()
    lost = parse_lost(result.stdout)
    hung = parse_hung(result.stdout)
    attempts = parse_attempts(result.stdout)
    warned = parse_block_end(result.stdout)
    queued = parse_slurm(result.stdout)
    slurm = slurminfo.of(cluster)
    for job_id, (code, alive, killed, launched, ended, record) in parse_status(result.stdout).items():
        job = local.get(job_id)
        if job is None:
            if record is None:
                continue
            job = JobRecord.from_dict(record)
        if job.finished and job.state != "lost":
            local[job_id] = job
            continue
        job.state, job.exit_code = derive_state(code, alive, killed, launched, job.started, now)
        job.servers_lost = lost.get(job_id, [])
        job.hung = hung.get(job_id)
        job.block_end_signal = warned.get(job_id, job.block_end_signal)
        if job_id in attempts:
            job.attempts = [a for a in attempts[job_id].get("attempts") or [] if isinstance(a, dict)]
            job.restart_verdict = attempts[job_id].get("verdict")
            job.waiting = attempts[job_id].get("waiting")  # for a replacement (run --replace-failed)
        if job.slurm:
            take_slurm(job, queued.get(job_id, {}), slurm)
        if job.state in ("failed", "lost") and job.failure is None:
            job.failure = failure.explain(session, job)
        if job.finished and job.ended is None:
            job.ended = ended or now
        local[job_id] = job
        save(job)
    for job in local.values():  # a running job whose directory vanished from the leader
        if job.state in ("running", "pending") and job.id not in result.stdout:
            job.state, job.ended = "lost", now
            save(job)
    return sorted(local.values(), key=lambda j: j.started)


def running_job_ids(session: ClusterSession) -> set[str]:
    """Ids of the cluster's jobs that are running now (the leader's view)."""
    return {j.id for j in refresh(session) if j.state == "running"}
