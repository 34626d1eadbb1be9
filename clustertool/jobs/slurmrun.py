"""`clustertool run` on a Slurm cluster: the job goes through Slurm's queue (``sbatch``), the ranks start
as they always do (mpirun, torchrun, accelerate, deepspeed, process), with the same variables.

* The nodes: Slurm picks them among the cluster's compute nodes that are not cordoned (``--exclude``),
  as many as the job needs (``--nodes N``: all of them, or what ``--np`` / ``--per-node`` fill); nodes
  named with ``run --nodes`` are Slurm's ``--nodelist``.  Whole nodes (``--exclusive``), every GPU (GRES).
* The plan is made for the first nodes that could run it (what each node runs depends only on its place
  in the allocation); the batch script (jobs/slurmbatch.py) finds the real ones when it runs.
* The leader keeps the job's folder as for every job: ``launch.sh`` runs the waiter
  (nodeprogs/slurmjob.py), which follows Slurm's state into ``slurm.json`` and the batch output into the
  log, and ends with the job's exit code.  A second job while the cluster is busy waits in the queue.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shlex
import time
from typing import Callable

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import RemoteError, UsageError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, JobRecord, Node, Reporter
from clustertool.jobs import records, scripts, slurmbatch, syncdir
from clustertool.jobs.jobplan import JobPlan, plan_job
from clustertool.jobs.jobrequests import RunRequest
from clustertool.jobs.mpirun import env_items
from clustertool.remote.group import run_on_node
from clustertool.slurm import slurmcmd, slurminfo
from clustertool.slurm.slurminfo import SlurmInfo
from clustertool.transfer.results import CopyResult, ProgressCb

POLL_S = 1.0  # how often the leader's waiter asks scontrol about the job


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the job may run: ``count`` nodes, ``per_node`` ranks each at most; ``nodelist`` (named by the user)
    or Slurm's pick among the rest but ``exclude`` (cordoned); ``model``: the first nodes that could run it."""

    count: int
    per_node: int
    nodelist: tuple[str, ...]
    exclude: tuple[str, ...]
    model: tuple[Node, ...]
    candidates: tuple[Node, ...]


def _refuse(request: RunRequest) -> None:
    """What a Slurm job does not take (yet), said before anything runs."""
    unsupported = [("--plugin (its reduction servers)", request.plugin),
                   ("--hang-timeout", request.hang.timeout is not None),
                   ("--replace-failed", request.recovery.replace_failed),
                   ("--on-preempt-signal", request.recovery.on_preempt_signal is not None)]
    given = [flag for flag, on in unsupported if on]
    if given:
        raise UsageError(f"{given[0]}: not for jobs that go through Slurm (yet)",
                         hint="Slurm requeues a job whose node died by itself; --restarts N requeues it on failure")


def placement(cluster: ClusterRecord, found: SlurmInfo, request: RunRequest, chosen: list[Node] | None) -> Placement:
    """``chosen``: the nodes `run --nodes` named (checked by launch.rank_nodes), None: Slurm picks."""
    compute = found.compute(cluster)
    cordoned = tuple(n.name for n in compute if n.cordoned)
    if chosen is not None:
        outside = [n.name for n in chosen if n.name not in found.nodes]
        if outside:
            raise UsageError(f"{nodeset.fold(outside)}: not a Slurm compute node of cluster {cluster.name!r}",
                             hint=f"its Slurm nodes: {nodeset.fold(found.nodes)}")
        usable = [n for n in compute if n in chosen]
    else:
        usable = [n for n in compute if not n.cordoned]
    if not usable:
        raise UsageError("no Slurm node to run on: every compute node is cordoned",
                         hint="`clustertool uncordon NODE`")
    slots = min(n.slots for n in usable)
    per_node = request.launch.per_node or slots
    count = len(usable)
    if chosen is None and request.launch.np is not None:
        count = math.ceil(request.launch.np / per_node)
        if count > len(usable):
            out = f" ({nodeset.fold(cordoned)} cordoned)" if cordoned else ""
            raise UsageError(f"--np {request.launch.np} needs {count} node(s) of {per_node} rank(s), and "
                             f"{len(usable)} can run jobs{out}",
                             hint="lower --np, or raise --per-node with --oversubscribe")
    nodelist = tuple(n.name for n in usable) if chosen is not None else ()
    return Placement(count, per_node, nodelist, () if nodelist else cordoned, tuple(usable[:count]), tuple(usable))


def _model_view(cluster: ClusterRecord, model: tuple[Node, ...]) -> ClusterRecord:
    """The record as the plan sees it: the model nodes only, the first one in the leader's place (rank 0)."""
    nodes = [dataclasses.replace(n, role=LEADER if i == 0 else MEMBER, cordon=None) for i, n in enumerate(model)]
    return dataclasses.replace(cluster, nodes=nodes)


def make_plan(cluster: ClusterRecord, where: Placement, request: RunRequest, job_id: str, home: str) -> JobPlan:
    opts = dataclasses.replace(request.mpi_options(), allocation=True)
    view = _model_view(cluster, where.model)
    plan = plan_job(view, list(view.nodes), opts, job_id,
                    sync=request.sync.target() if request.sync is not None else None)
    return plan.with_facts(home)


def batch_job(cluster: ClusterRecord, found: SlurmInfo, plan: JobPlan, request: RunRequest, home: str,
              fallback_port: int) -> slurmbatch.BatchJob:
    """What the batch script runs: mpirun inside the allocation, or the job agent on each node."""
    job_dir = f"{home}/{JOBS_DIR}/{plan.job_id}"
    static = {k: v for k, v in plan.options.rank_env.items() if k not in slurmbatch.DYNAMIC}
    passed = [*slurmbatch.DYNAMIC, slurmbatch.STEP_ENV]  # mpirun -x: its ranks carry the step's marker too
    opts = dataclasses.replace(plan.options, rank_env=static, env=[*plan.options.env, *passed],
                               output_dir=slurmbatch.OUT, hostfile=None)
    env, bare = _split(env_items(opts))
    addresses = {found.slurm_name(n.name): n.address for n in cluster.nodes if n.name in found.nodes}
    files: dict[str, str] = {}
    if plan.spec.node_launcher:
        step = slurmbatch.agent_step(job_dir)
        files = {"jobagent.py": (nodeprogs.DIR / "jobagent.py").read_text(),
                 "agent.json": json.dumps(plan.agent_plan(master_addr="{master_addr}"))}
    else:
        step = dataclasses.replace(plan, options=opts).argv
        env = {}  # mpirun's -x carries them
    return slurmbatch.BatchJob(plan.job_id, job_dir, step, plan.spec.node_launcher, addresses, env=env,
                               passed=bare, output_dir=plan.options.output_dir or f"{job_dir}/out",
                               workdir=plan.options.workdir, restarts=request.restarts.count,
                               restart_codes=request.restarts.exit_codes, agent_files=files,
                               fallback_port=fallback_port)


def _split(items: list[str]) -> tuple[dict[str, str], list[str]]:
    values, bare = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            values[key] = value
        else:
            bare.append(key)
    return values, bare


def sbatch_spec(found: SlurmInfo, where: Placement, plan: JobPlan, job_dir: str, after: str | None,
                workdir: str) -> slurmcmd.BatchSpec:
    extra = ["--overcommit"] + ([f"--gres=gpu:{found.gpus}"] if found.gpus else [])
    return slurmcmd.BatchSpec(script=f"{job_dir}/batch.sh", nodes=where.count,
                              ntasks_per_node=max(c for _, c in plan.layout),
                              nodelist=found.slurm_names(where.nodelist),
                              exclude=found.slurm_names(where.exclude), job_name=plan.job_id,
                              output="/dev/null", chdir=workdir, requeue=True,  # the script writes batch.out
                              partition=found.partition, dependency=f"afterany:{after}" if after else None,
                              extra=tuple(extra))


def _home(session: ClusterSession) -> str:
    result = run_on_node(session, session.record.leader, 'echo "$HOME"', timeout=30)
    home = result.stdout.strip()
    if not result.ok or not home.startswith("/"):
        raise RemoteError(f"the leader did not say its home folder: {result.reason or result.stdout!r}")
    return home


def _after(session: ClusterSession, ref: str | None) -> str | None:
    """``run --after JOB``: that job's Slurm id (it must be one of this cluster's Slurm jobs)."""
    if ref is None:
        return None
    job = records.resolve(records.load_all(session.name), ref)
    if not job.slurm or not job.slurm.get("id"):
        raise UsageError(f"--after {ref}: job {job.id} did not go through Slurm", hint="name a job of this cluster's "
                         "queue (`clustertool jobs`)")
    return str(job.slurm["id"])


@dataclasses.dataclass
class Submitted:
    """What `run` made of a Slurm job: its record, the sbatch argv, and what --sync sent."""

    job: JobRecord
    argv: list[str]
    sync: tuple[str, str] | None = None
    synced: CopyResult | None = None


RecordFn = Callable[[ClusterRecord, JobPlan, RunRequest, "str | None"], JobRecord]


def _fallback_port(job_id: str) -> int:
    return 29500 + int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % 10000


def run(session: ClusterSession, request: RunRequest, chosen: list[Node] | None, job_record: RecordFn, *,
        dry_run: bool = False, on_progress: ProgressCb | None = None) -> Submitted:
    """Submit the job to the cluster's Slurm (its waiter started on the leader); ``request.after``: a job of
    this cluster it waits for (``afterany``: however that one ends).  ``job_record``: the record of a plan
    (jobs/launch.py's, the same for every job)."""
    cluster = session.ready()
    found = slurminfo.require(cluster, "run")
    _refuse(request)
    where = placement(cluster, found, request, chosen)
    job_id = records.new_id()
    home = "$HOME" if dry_run else _home(session)
    plan = make_plan(cluster, where, request, job_id, home)
    slurm_after = _after(session, request.after)
    batch = batch_job(cluster, found, plan, request, home, _fallback_port(job_id))
    spec = sbatch_spec(found, where, plan, batch.job_dir, slurm_after, plan.options.workdir or home)
    argv = slurmcmd.with_conf(found.layout, slurmcmd.sbatch_argv(spec))
    job = job_record(cluster, plan, request, None)
    job.nodes, job.argv = [], list(argv)
    if dry_run:
        return Submitted(job, argv, sync=plan.sync)
    synced = _sync(session, request, where, on_progress)
    job.slurm = {"id": submit(session, found, job, plan, batch, argv), "state": "PENDING", "reason": "None",
                 "nodes": [], "after": slurm_after, "restarts": 0, "attempts": []}
    job.state, job.detached = "pending", job.detached or "setsid"
    records.save(job)
    session.report(f"job {job.id}: Slurm job {job.slurm['id']} queued for {where.count} node(s)"
                   + (f" after Slurm job {slurm_after}" if slurm_after else ""))
    return Submitted(job, argv, sync=plan.sync, synced=synced)


def _sync(session: ClusterSession, request: RunRequest, where: Placement,
          on_progress: ProgressCb | None) -> CopyResult | None:
    if request.sync is None:
        return None
    local, dest = request.sync.target()
    session.report(f"syncing {local} to {dest} on {nodeset.fold(n.name for n in where.candidates)} (any may run it)")
    return syncdir.sync(session, local, dest, list(where.candidates), on_progress=on_progress)


def waiter_program(found: SlurmInfo, cluster: ClusterRecord, batch: slurmbatch.BatchJob) -> bytes:
    jobcomp = f"{found.layout.log_dir}/jobcomp.log" if found.made else None
    return nodeprogs.program_text("slurmjob", {
        "job_dir": batch.job_dir, "slurm_id": None, "conf": found.layout.slurm_conf if found.layout.needs_conf_env
        else None, "batch_out": f"{batch.job_dir}/batch.out", "poll": POLL_S, "jobcomp": jobcomp,
        "addresses": batch.addresses})


def submit(session: ClusterSession, found: SlurmInfo, job: JobRecord, plan: JobPlan, batch: slurmbatch.BatchJob,
           argv: list[str]) -> str:
    """One round trip to the leader: the job's files, ``sbatch``, then the waiter detached.  Returns the id."""
    cluster = session.record
    launch = scripts.launch_script(job.id, ["sh", "-c", 'exec python3 "$0/slurmjob.py" "$(cat "$0/slurm_id")"',
                                            batch.job_dir], None)
    script = scripts.install_and_start_script(
        job.id, launch, "", json.dumps(job.to_dict()), extra_files={
            "batch.sh": slurmbatch.batch_script(batch),
            "slurmjob.py": waiter_program(found, cluster, batch).decode()},
        before_start=[f'id=$({shlex.join(argv)}) || {{ echo "sbatch refused the job: $id" >&2; exit 3; }}',
                      'id=${id%%;*}; echo "$id" > "$d/slurm_id"; echo "slurm_id=$id"',
                      # the leader's record names Slurm's job too (another home that reads it follows the same)
                      'sed -i "s/\"slurm\": null/\"slurm\": {\"id\": \"$id\"}/" "$d/job.json"'])
    result = run_on_node(session, cluster.leader, "sh -s", timeout=60, stdin_data=script.encode())
    said = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    if not result.ok or not said.get("slurm_id", "").isdigit():
        why = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.reason
        raise RemoteError(f"could not queue the job in Slurm on {cluster.leader.name}: {why}",
                          hint="`clustertool doctor --check slurm` checks the cluster's Slurm")
    job.detached = said.get("detached", "setsid")
    job.started = time.time()
    return said["slurm_id"]


def wait_started(session: ClusterSession, job_id: str, *, report: Reporter | None = None,
                 poll: float = 1.0) -> JobRecord:
    """Until the job left Slurm's queue (it runs, or ended without running); its record then."""
    said = None
    while True:
        job = records.resolve(records.refresh(session), job_id)
        if job.state != "pending":
            return job
        reason = (job.slurm or {}).get("reason")
        if report is not None and reason and reason != "None" and reason != said:
            report(f"job {job.id} waits in Slurm's queue ({reason})")
            said = reason
        time.sleep(poll)

