"""`clustertool kill`: stop a job's processes on every node, by job, then verify.

On each node of the job at once: signal the processes that belong to the job (its
environment marker, the sessions its launcher and rank wrappers recorded, the orted
parents), wait the grace period, KILL what is left, and report what remains (nothing,
normally) and whether GPU memory is still held (where nvidia-smi exists).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord, GroupResult, JobRecord, jsonable
from clustertool.jobs import records, scripts, slurmjobs
from clustertool.jobs.jobrequests import KillRequest
from clustertool.remote.group import run_on_nodes


@dataclass
class NodeKill:
    node: str
    signaled: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)  # "pid:comm"
    gpu: str = "no nvidia-smi"  # "no nvidia-smi" | "freed" | "held: pid:MiB ..."
    error: str | None = None

    @property
    def clean(self) -> bool:
        return self.error is None and not self.remaining and not self.gpu.startswith("held")


@dataclass
class KillResult:
    job: JobRecord | None
    nodes: list[NodeKill]
    slurm: str | None = None  # a Slurm job: what scancel left ("cancelled", or the state it still is in)

    @property
    def clean(self) -> bool:
        return all(n.clean for n in self.nodes)

    def to_dict(self) -> dict:
        """What `kill --json` prints."""
        return {"job": jsonable(self.job), "clean": self.clean, "nodes": jsonable(self.nodes), "slurm": self.slurm}


def parse_kill_output(node: str, text: str) -> NodeKill:
    out = NodeKill(node)
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        values = rest.split()
        if word == "signaled":
            out.signaled = [int(v) for v in values if v.isdigit()]
        elif word == "forced":
            out.forced = [int(v) for v in values if v.isdigit()]
        elif word == "remaining":
            out.remaining = values
        elif word == "gpu":
            if values[:1] == ["checked"]:
                out.gpu = "held: " + " ".join(values[1:]) if values[1:] else "freed"
    return out


def pick_running(jobs: list[JobRecord], ref: str | None) -> JobRecord:
    if ref:
        job = records.resolve(jobs, ref)
        if job.finished:
            code = f" with exit code {job.exit_code}" if job.exit_code is not None else ""
            verb = {"killed": "was killed", "lost": "was lost (ended without an exit code)"}.get(job.state, job.state)
            raise UsageError(f"job {job.id} is not running: it {verb}{code}",
                             hint="`clustertool jobs` lists jobs; `clustertool clean` removes old ones")
        return job
    running = [j for j in jobs if j.state in ("running", "pending")]
    if not running:
        raise UsageError("no running job on this cluster", hint="`clustertool jobs` lists jobs")
    if len(running) > 1:
        raise UsageError(f"{len(running)} jobs are running ({', '.join(j.id for j in running[:4])}"
                         f"{' ...' if len(running) > 4 else ''}): say which",
                         hint=f"e.g. {running[-1].id} (the latest)")
    return running[0]


def _per_node(result: GroupResult) -> list[NodeKill]:
    """What each node's kill run reports; a node where it did not run to its end says why."""
    out = []
    for r in result.results:
        nk = parse_kill_output(r.node, r.stdout)
        nk.error = r.reason or None
        out.append(nk)
    return out


def kill(session: ClusterSession, ref: str | None = None, *, signal: str = "TERM", grace: float = 10.0) -> KillResult:
    cluster = session.reload()
    job = pick_running(records.refresh(session), ref)
    if grace < 0:
        raise UsageError(f"--grace {grace:g}: give 0 or more seconds",
                         hint="e.g. --grace 10 (TERM, then KILL 10 s later)")
    slurm = None
    if job.slurm:  # Slurm's job: scancel, until Slurm lets it go; then the check on its nodes below
        slurm = slurmjobs.cancel(session, job, signal.upper(), grace)
        job = {j.id: j for j in records.refresh(session)}.get(job.id, job)
    names = list(job.nodes) + [s for s in job.servers if s not in job.nodes]  # its reducers: on the servers
    nodes = [cluster.node(n) for n in names if n in {x.name for x in cluster.nodes}]
    script = scripts.kill_script(job.id, signal.upper(), 0 if signal.upper() == "KILL" else grace)
    result = run_on_nodes(session, nodes, "sh -s", timeout=grace + 60, stdin_data=script.encode())
    per_node = _per_node(result)
    refreshed = {j.id: j for j in records.refresh(session)}
    job = refreshed.get(job.id, job)
    if job.state in ("running", "pending") and (slurm is None or slurm == "cancelled"):
        job.state = "killed"  # the leader was unreachable (or its waiter has not seen the end yet): recorded here
        records.save(job)
    return KillResult(job, per_node, slurm)


def kill_all_python(session: ClusterSession, selection: str | None = None) -> KillResult:
    """The seeds' blunt fallback: ``pkill -9 python`` on every (selected) node."""
    cluster: ClusterRecord = session.reload()
    nodes = nodeset.select(cluster, selection)
    line = ("echo \"signaled $(pgrep -x 'python[0-9.]*' | tr '\\n' ' ')\"; pkill -9 -x 'python[0-9.]*' ; sleep 0.3; "
            "echo \"remaining $(pgrep -x 'python[0-9.]*' | tr '\\n' ' ')\"")
    out = _per_node(run_on_nodes(session, nodes, line, timeout=60))
    if all(n.error for n in out):
        raise ToolError("no node could be reached", exit_code=255)
    return KillResult(None, out)


def run(session: ClusterSession, request: KillRequest) -> KillResult:
    """`clustertool kill`: the request's job by its processes (or, ``all_python``, every python process)."""
    if request.all_python:
        return kill_all_python(session, request.nodes)
    return kill(session, request.job, signal=request.signal, grace=request.grace)
