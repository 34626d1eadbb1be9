"""`clustertool run`: a request (jobs/jobrequests.py), its plan (jobs/jobplan.py), preflight, then mpirun
on the leader, detached (tmux, else setsid).

The job survives the user's connection: the leader's tmux server (or a setsid'd shell)
owns it, not our ssh session.  jobs/follow.py streams the job's lines until it ends.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import RemoteError, ToolError, UsageError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import ClusterRecord, GroupResult, JobRecord, Node
from clustertool.jobs import checkpoints, output, records, recoveryprep, scripts
from clustertool.jobs.jobplan import FAN, JobPlan, plan_job
from clustertool.jobs.jobrequests import RunRequest
from clustertool.jobs.mpirun import split_command
from clustertool.jobs.recorder import recorder_program
from clustertool.nodeprogs import program_text
from clustertool.providers.base import IMAGE_PYTHON, RankEnvironment
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.slurm import slurminfo

# Imported where they are used (`run` starts faster): the plugin's reducers, Slurm's path, --sync's copy,
# the hang check's stacks, and the recovery module (which brings `replace` and the cluster spec).
if TYPE_CHECKING:
    from clustertool.jobs.reducers import Reducer
    from clustertool.transfer.results import CopyResult, ProgressCb


@dataclass
class Launch:
    job: JobRecord
    argv: list[str]
    dry_run: bool = False
    sync: tuple[str, str] | None = None  # --sync: (the local folder, its path on the nodes)
    synced: CopyResult | None = None  # what --sync sent (None without --sync, or on a dry run)
    node_commands: list[tuple[str, list[str]]] | None = None  # a dry run of a node launcher: each node's command
    python: str | None = None  # a dry run: which Python the ranks get, in words

    def to_dict(self) -> dict:
        """What `run --json` prints: the job's record, plus "sync" (what was sent) with --sync.
        A dry run: the mpirun argv, nodes, ranks (and where --sync would send what)."""
        if self.dry_run:
            out = {"argv": self.argv, "nodes": self.job.nodes, "np": self.job.np, "launcher": self.job.launcher,
                   "python": self.python}
            if self.node_commands:
                out["node_commands"] = {name: argv for name, argv in self.node_commands}
            if self.sync is not None:
                out["sync"] = {"dir": self.sync[0], "dest": self.sync[1]}
            return out
        out = self.job.to_dict()
        if self.synced is not None:
            out["sync"] = self.synced.to_dict()
        return out


def rank_nodes(cluster: ClusterRecord, selection: str | None) -> list[Node]:
    """The nodes a job's ranks run on: the selection (default: every worker not cordoned); servers are
    never ranks.  A group (workers, members, all) leaves cordoned nodes out; a cordoned node named
    by itself is refused."""
    nodes = cluster.schedulable if selection is None else nodeset.select(cluster, selection, usable=True)
    servers = [n.name for n in nodes if n.is_server]
    if servers:
        what = "is a reduction server" if len(servers) == 1 else "are reduction servers"
        raise UsageError(f"{nodeset.fold(servers)} {what}, not rank nodes",
                         hint="leave servers out of --nodes (`run --plugin` starts the reducers on them itself)")
    cordoned = [n for n in nodes if n.cordoned]
    if cordoned:
        names = nodeset.fold(n.name for n in cordoned)
        why = str((cordoned[0].cordon or {}).get("reason") or "")
        why = why if len(why) <= 60 else why[:57] + "..."  # the error stays one line
        raise UsageError(f"{names} {'is' if len(cordoned) == 1 else 'are'} cordoned"
                         + (f" ({why})" if why and len(cordoned) == 1 else "") + ": jobs do not run there",
                         hint=f"leave it out of --nodes, or `clustertool uncordon {names}` first (to try a repaired "
                              "node)")
    return nodes


ENDING_GRACE_S = 10.0  # how long a job that has ended may take to lose its last processes


def _scan(session: ClusterSession, nodes: list[Node], program: str | None = None, path: str | None = None,
          then: str | None = None, port: bool = True) -> tuple[GroupResult, dict[str, list[str]]]:
    """(the scan's result, {job id: [nodes with its processes]}); ``program``: a program the ranks cannot find
    there is a UsageError naming it and the nodes; ``then``: shell lines run after the scan, in the same
    connection (a node launcher's agent, put in place)."""
    script = (scripts.scan_script(program, path, port) + (f"\n{then}" if then else "")).encode()
    result = run_on_nodes(session, nodes, "sh -s", timeout=20, stdin_data=script)
    down = result.failed()
    if down:
        detail = ", ".join(f"{r.node} ({r.reason})" for r in down)
        raise RemoteError(f"preflight: {len(down)} node(s) not ready: {detail}",
                          hint="`clustertool doctor` says more")
    missing = [r.node for r in result.results if any(ln.startswith("missing=") for ln in r.stdout.splitlines())]
    if missing:
        where = "" if program and "/" in program else " (the ranks' PATH there)"
        raise UsageError(f"{program}: not found on {nodeset.fold(missing)}{where}",
                         hint="give its full path, or -x PATH=DIR:/usr/bin:/bin for its folder DIR (`clustertool "
                              "run --dry-run` says which python the ranks get)")
    busy: dict[str, list[str]] = {}
    for r in result.results:
        for line in r.stdout.splitlines():
            if line.startswith("running "):
                busy.setdefault(line.split("=", 1)[1], []).append(r.node)
    return result, busy


def _ended(session: ClusterSession, job_ids: Iterable[str]) -> bool:
    """Every one of these jobs has its exit recorded on the leader (it ended; its last processes
    may still be exiting, e.g. ranks after mpirun returned)."""
    cluster = session.record
    line = " && ".join(f"test -f {scripts.job_dir_sh(j)}/exit" for j in sorted(job_ids))
    return run_on_node(session, cluster.leader, line, timeout=20).ok


def preflight(session: ClusterSession, nodes: list[Node], allow_concurrent: bool,
              grace: float = ENDING_GRACE_S, *, program: str | None = None,
              path: str | None = None, install: str | None = None, port: bool = True) -> tuple[str, int | None]:
    """Every node answers; no other clustertool job has processes there; the ranks find ``program`` there
    (with ``path``, their PATH; else the node's own). Returns the leader's $HOME and a port free there now
    (None where the leader has no python3 to ask, or not ``port``).  ``install``: shell lines each node runs
    after its scan (in the same connection: one round trip, not two); the caller takes them back if preflight
    refuses.

    Processes of a job that has ended (the one before, in a loop of jobs) get ``grace`` seconds to go."""
    cluster = session.record
    result, busy = _scan(session, nodes, program, path, install, port)
    deadline = time.monotonic() + grace
    while busy and not allow_concurrent and time.monotonic() < deadline and _ended(session, busy):
        time.sleep(0.3)
        busy = _scan(session, [n for n in nodes if any(n.name in w for w in busy.values())], port=False)[1]
    if busy and not allow_concurrent:
        job_id, where = next(iter(busy.items()))
        if _ended(session, [job_id]):
            raise UsageError(f"job {job_id} has ended but processes of it are still on {nodeset.fold(where)}",
                             hint="`clustertool doctor --fix` kills them; or add --allow-concurrent")
        raise UsageError(f"job {job_id} is still running on {nodeset.fold(where)}",
                         hint=f"wait, `clustertool kill {job_id}`, or add --allow-concurrent")
    said = dict(line.split("=", 1) for line in result.by_node()[cluster.leader.name].stdout.splitlines()
                if line.startswith(("home=", "port=")))
    if "home" not in said:
        raise RemoteError("preflight: the leader did not say its home directory")
    return said["home"], int(said["port"]) if said.get("port", "").isdigit() else None


def _fallback_port(job_id: str) -> int:
    """A port of its own for each job where the leader could not name a free one."""
    return 29500 + int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % 10000


def run(session: ClusterSession, request: RunRequest, *, dry_run: bool = False,
        on_progress: ProgressCb | None = None) -> Launch:
    """Start the job ``request`` asks for (after sending its ``sync`` folder to the job's nodes); ``dry_run``:
    only plan it.  Progress lines go to the session's reporter, the sync's bars to ``on_progress``.

    The plan holds what the nodes run; the job's record (what `jobs` shows, what the leader's
    supervisor, restart loop and spot watcher read) is derived from the request and the plan."""
    cluster = session.ready()
    report = session.report
    if slurminfo.wanted(cluster):  # through Slurm's queue (jobs/slurmrun.py)
        from clustertool.jobs import slurmrun

        chosen = rank_nodes(cluster, request.nodes) if request.nodes is not None else None
        made = slurmrun.run(session, request, chosen, job_record, dry_run=dry_run, on_progress=on_progress)
        return Launch(made.job, made.argv, dry_run=dry_run, sync=made.sync, synced=made.synced)
    if request.after is not None:
        raise UsageError("--after: only on a Slurm cluster (its queue holds the job until the other ends)",
                         hint="`clustertool up --scheduler slurm` makes one; `clustertool logs -f JOB` waits here")
    nodes = rank_nodes(cluster, request.nodes)
    servers = cluster.schedulable_servers if request.plugin else []  # a cordoned server gets no reducer
    env: dict[str, str] = {}
    if request.plugin:
        from clustertool.plugin.deploy import plugin_env

        env = plugin_env(cluster)
    if servers:  # the real ports are known once the reducers listen (after preflight)
        from clustertool.jobs import reducers

        env[reducers.ENV_LIST] = ",".join(f"{n.address}:PORT" for n in servers)
    synced_dir = request.sync.target() if request.sync is not None else None
    environment = session.provider.rank_environment(cluster)
    plan = plan_job(cluster, nodes, request.mpi_options(), records.new_id(), sync=synced_dir, plugin_env=env,
                    servers=servers, node_env=environment.env)
    preempt = recoveryprep.preempt_signal(cluster, request.recovery)
    checkpoint_warning = checkpoints.warning(cluster, request.checkpoint_dir, request.restarts.count)
    if checkpoint_warning:
        report(f"warning: {checkpoint_warning}")
    if dry_run:
        commands = [(n.name, argv) for n, argv in plan.shown_node_commands()] if plan.spec.node_launcher else None
        return Launch(job_record(cluster, plan, request, preempt), plan.argv, dry_run=True, sync=synced_dir,
                      node_commands=commands, python=_python(plan, environment))
    report(f"preflight on {nodeset.fold(n.name for n in plan.nodes)}")
    install = None
    if plan.spec.node_launcher:  # the agents go in with preflight's scan (their plan's $HOME expands on the node)
        report(f"{plan.launcher}: one launcher on each of {nodeset.fold(n.name for n, _ in plan.layout)}")
        install = scripts.agent_install_script(plan.job_id, json.dumps(plan.agent_plan()))
    try:
        # a node launcher's port: the fan-out's pick on the leader, as it starts (no python3 run for it here)
        home, port = preflight(session, list(plan.nodes), request.allow_concurrent, program=plan.program,
                               path=plan.rank_path, install=install, port=install is None)
    except UsageError:  # refused (another job there, no such program): the agents taken back (a node that did
        if install:      # not answer keeps an unused folder, which `clustertool clean` removes)
            run_on_nodes(session, list(plan.nodes), f"rm -rf {scripts.job_dir_sh(plan.job_id)}", timeout=20)
        raise
    synced = None
    if synced_dir is not None:
        report(f"syncing {synced_dir[0]} to {synced_dir[1]} on {nodeset.fold(n.name for n in plan.nodes)}")
        from clustertool.jobs import syncdir

        synced = syncdir.sync(session, *synced_dir, list(plan.nodes), on_progress=on_progress)
    started: list[Reducer] = []
    plugin_extra: dict[str, str] = {}
    if request.plugin:
        from clustertool.jobs import reducers

        started = reducers.start(session, plan.job_id, plugin_env_dest(cluster)) if servers else []
        plugin_extra = {**(reducers.env(started) if started else {}),
                        **reducers.stats_env(home, plan.job_id, request.launch.env)}
    plan = plan.with_facts(home, plugin_extra or None, port or _fallback_port(plan.job_id))
    try:
        launched = _start(session, plan, job_record(cluster, plan, request, preempt), started, synced, request.record)
    except BaseException:
        if started:
            from clustertool.jobs import reducers

            reducers.stop(session, plan.job_id, [r.node for r in started])
        raise
    recoveryprep.keep_request(launched.job, request)  # a lost leader: the job is planned again from its request
    return launched


def _python(plan: JobPlan, environment: RankEnvironment) -> str:
    """Which Python the ranks get, in words (a dry run says it)."""
    if plan.rank_path == environment.env.get("PATH"):
        return environment.python
    if plan.rank_path is None:
        return IMAGE_PYTHON
    return f"the first python on the PATH given with -x ({plan.rank_path})"


SUPERVISE_INTERVAL_S = 2.0  # how often the supervisor asks the job's other nodes
SUPERVISE_MISSES = 3  # rounds without an answer before a node counts as gone


def _supervisor(plan: JobPlan, job: JobRecord) -> bytes | None:
    """The leader's supervisor for a job with other nodes, or a hang timeout (nodeprogs/supervise.py)."""
    others = list(plan.nodes[1:])
    if not others and job.hang_timeout is None:
        return None
    return program_text("supervise", {"job_dir": f"{plan.home}/{JOBS_DIR}/{plan.job_id}", "nodes": _node_ports(others),
                                      "interval": SUPERVISE_INTERVAL_S, "misses": SUPERVISE_MISSES, "grace": 5.0,
                                      "hang_timeout": job.hang_timeout, "hang_action": job.hang_action,
                                      "all_nodes": [[n.name, n.address] for n in plan.nodes]})


def _node_ports(nodes: Iterable[Node]) -> list[list[object]]:
    """[name, address, ssh port as the leader reaches it] of each node (the leader asks their ssh ports)."""
    return [[n.name, n.address, n.ssh_port if n.ssh_host in (None, n.address) else 22] for n in nodes]


def _hang_stacks(plan: JobPlan, job: JobRecord) -> bytes | None:
    """The stacks node program the supervisor runs on every node when the job looks hung."""
    if job.hang_timeout is None:
        return None
    from clustertool.jobs import stacks

    return program_text("stacks", stacks.node_args(plan.job_id, None, 10.0))


def _install_agent(session: ClusterSession, plan: JobPlan) -> None:
    """The job agent and its plan, in the job's folder on every node that runs ranks, on their own (`run` sends
    them with preflight's scan; a job planned again after a lost leader, jobs/replan.py, sends them here)."""
    nodes = [n for n, _ in plan.layout]
    session.report(f"{plan.launcher}: one launcher on each of {nodeset.fold(n.name for n in nodes)}")
    script = scripts.agent_install_script(plan.job_id, json.dumps(plan.agent_plan()))
    result = run_on_nodes(session, nodes, "sh -s", timeout=30, stdin_data=script.encode())
    down = result.failed()
    if down:
        detail = ", ".join(f"{r.node} ({r.reason})" for r in down)
        raise RemoteError(f"could not put the job agent on {len(down)} node(s): {detail}")


def _restarter(plan: JobPlan, job: JobRecord, replacer: str | None = None) -> bytes | None:
    """The restart loop that runs mpirun on the leader, once per attempt (nodeprogs/restarts.py); ``replacer``:
    who replaces a lost node (the cluster's controller), named in its wait line."""
    if not job.restarts:
        return None
    return program_text("restarts", {"job_dir": f"{plan.home}/{JOBS_DIR}/{plan.job_id}", "argv": plan.argv,
                                     "out": plan.options.output_dir, "restarts": job.restarts,
                                     "codes": job.restart_on_exit_codes, "nodes": _node_ports(plan.nodes[1:]),
                                     "replace_failed": job.replace_failed, "replace_wait": job.replace_wait,
                                     "replacer": replacer})


def replacer_of(cluster: ClusterRecord) -> str | None:
    """Who replaces a lost node of the cluster's jobs without `recover`: its controller, where `up` started one."""
    return "the cluster's controller" if cluster.options.get("controller") else None


def job_record(cluster: ClusterRecord, plan: JobPlan, request: RunRequest, preempt: str | None) -> JobRecord:
    """The job's record: what the request asked, what the plan made (``preempt``: the signal a spot
    notice sends, where notices are watched)."""
    return JobRecord(id=plan.job_id, cluster=cluster.name, command=split_command(request.command), argv=plan.argv,
                     nodes=[n.name for n in plan.nodes], np=plan.np, name=request.name, leader=cluster.leader.name,
                     workdir=plan.options.workdir, launcher=plan.launcher, started=time.time(),
                     output_dir=plan.options.output_dir, tag_output=plan.options.tag_output,
                     servers=[n.name for n in plan.servers], hang_timeout=request.hang.timeout,
                     hang_action=request.hang.action, restarts=request.restarts.count,
                     restart_on_exit_codes=None if request.restarts.exit_codes is None
                     else list(request.restarts.exit_codes),
                     replace_failed=request.recovery.replace_failed, replace_wait=request.recovery.wait_s,
                     on_preempt_signal=preempt)


def plugin_env_dest(cluster: ClusterRecord) -> str:
    from clustertool.plugin.build import load_record

    return load_record(cluster.name)["deployed"]["dest"]


def _start(session: ClusterSession, plan: JobPlan, job: JobRecord, started: list[Reducer],
           synced: CopyResult | None, record: bool = True, prefix: str = "") -> Launch:
    """Send the job's files to the leader and start it there (``prefix``: shell lines run first: the attempts so
    far of a job planned again after its leader was lost, jobs/replan.py)."""
    cluster = session.record
    epilogue: list[str] = []
    if started:
        from clustertool.jobs import reducers

        epilogue = reducers.epilogue_lines(plan.job_id, started)
    launch_sh = scripts.launch_script(plan.job_id, plan.argv, plan.options.workdir, epilogue=epilogue,
                                      restarts=bool(job.restarts))
    job.detached = "pending"
    fan = {FAN: (nodeprogs.DIR / "fan.py").read_text()} if plan.spec.node_launcher else None
    script = scripts.install_and_start_script(plan.job_id, launch_sh, plan.hostfile, json.dumps(job.to_dict()),
                                              pane=output.pane_program(job), supervisor=_supervisor(plan, job),
                                              hangstacks=_hang_stacks(plan, job),
                                              restarter=_restarter(plan, job, replacer_of(cluster)),
                                              spot=recoveryprep.spot_program(plan, job),
                                              recorder=recorder_program(session, plan) if record else None,
                                              extra_files=fan, before_start=[f'chmod 755 "$d/{FAN}"'] if fan else ())
    recoveryprep.keep_launch(job, script)  # a lost leader takes the job's files: the recovery loop sends them again
    what = f"{job.launcher} on {len(plan.layout)} node(s)" if fan else f"{shlex.join(plan.argv[:1])} -np {job.np}"
    session.report(f"starting job {plan.job_id} on {cluster.leader.name}: {what} ...")
    result = run_on_node(session, cluster.leader, "sh -s", timeout=30, stdin_data=(prefix + script).encode())
    if not result.ok:
        raise RemoteError(f"could not start the job on the leader: {result.reason}")
    job.detached = "tmux" if "detached=tmux" in result.stdout else "setsid"
    records.save(job)
    return Launch(job, plan.argv, sync=plan.sync, synced=synced)


def wait(session: ClusterSession, job_id: str, *, timeout: float | None = None, poll: float = 2.0) -> JobRecord:
    """Ask the leader until the job has ended (or ``timeout`` seconds passed); its final record."""
    session.reload()
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = min(0.5, poll)
    while True:
        job = records.resolve(records.refresh(session), job_id)
        if job.finished:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise ToolError(f"job {job.id} is still running after {timeout:g}s",
                            hint=f"wait longer, follow it (`clustertool logs -f {job.id}`) or stop it "
                                 f"(`clustertool kill {job.id}`)")
        time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(poll, delay * 2)
