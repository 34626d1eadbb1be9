"""Job commands: run, jobs, logs, attach, kill, reboot, clean, fetch."""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from clustertool.cli.common import (
    BareValueCommand,
    ClusterOpt,
    JsonOpt,
    NodesOpt,
    complete_job,
    confirm,
    open_session,
)

if TYPE_CHECKING:  # a fast --help: the core loads in the command
    from clustertool.core.model import JobRecord
    from clustertool.jobs.launch import Launch


class RunCommand(BareValueCommand):
    bare_values = {"--sync": "."}  # `run --sync -- CMD`: this folder


def _strip_dashes(command: Optional[List[str]]) -> List[str]:
    words = list(command or [])
    return words[1:] if words[:1] == ["--"] else words


def _echo_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _warn(text: str) -> None:
    sys.stderr.write(f"warning: {text}\n")


def _follow(name: str, job: JobRecord) -> int:
    """`run --follow`: the job's lines until it ends (its recovery loop beside, with --replace-failed); its code."""
    from clustertool.jobs.follow import follow, why_failed

    session = open_session(name)  # the recovery loop's progress on stderr (with --json too)
    code = follow(session, job, _echo_line, warn=_warn, recover=True)  # Ctrl-C: run() says it keeps running
    _report(session, job)  # before the verdict: a failed job's last line says why
    if code != 0:
        why = why_failed(session, job.id)
        if why:
            sys.stderr.write(why + "\n")
    if code is None:
        sys.stderr.write(f"job {job.id} ended without an exit code (killed or lost)\n")
        if job.replace_failed:  # the leader was lost: the stream and its restart loop went with it
            sys.stderr.write(f"if its leader was lost: `clustertool recover -c {name} {job.id}` replaces it and "
                             "starts the job again there\n")
        return 1 if job.state != "killed" else 143
    return code


def _report(session: Any, job: JobRecord) -> None:  # the open session
    """The job's picture, once it ended: `report: PATH` (nothing where it has no record)."""
    from clustertool.watch.report import end_of_job

    line = end_of_job(session, job.id)
    if line:
        sys.stderr.write(line + "\n")


def run(
    command: Optional[List[str]] = typer.Argument(None, metavar="-- COMMAND...",
                                                  help="The program and its arguments (after --)."),
    cluster: Optional[str] = ClusterOpt,
    nodes: Optional[str] = typer.Option(
        None, "--nodes", "-n", metavar="SEL",
        help="The ranks' nodes: leader, members, workers, node-[2-5], comma lists (default: every worker not "
             "cordoned; a group leaves cordoned nodes out, a cordoned node named by itself is refused)."),
    launcher: Optional[str] = typer.Option(
        None, "--launcher", metavar="NAME",
        help="What starts the ranks: mpirun (default), torchrun, accelerate, deepspeed, or process (one process "
             "per slot, started by clustertool). A command that starts with torchrun, python -m "
             "torch.distributed.run, accelerate launch or deepspeed gets that launcher by itself, its options kept."),
    np: Optional[int] = typer.Option(None, "--np", help="Number of ranks (default: all slots)."),
    per_node: Optional[int] = typer.Option(None, "--per-node", help="Ranks per node (caps the slots used)."),
    export: List[str] = typer.Option([], "-x", help="Export VAR=VALUE (or VAR: the leader's value) to every rank."),
    mpi_arg: List[str] = typer.Option([], "--mpi-arg", help="Extra argument for mpirun (repeat)."),
    plugin: bool = typer.Option(False, "--plugin", help="Add the clustertool NCCL plugin's environment."),
    fusion_mb: Optional[float] = typer.Option(None, "--horovod-fusion-mb", help="HOROVOD_FUSION_THRESHOLD in MiB."),
    cycle_ms: Optional[float] = typer.Option(None, "--horovod-cycle-ms", help="HOROVOD_CYCLE_TIME in ms."),
    timeline: Optional[str] = typer.Option(None, "--horovod-timeline", help="HOROVOD_TIMELINE path."),
    autotune: bool = typer.Option(False, "--horovod-autotune", help="HOROVOD_AUTOTUNE=1."),
    nccl_debug: Optional[str] = typer.Option(None, "--nccl-debug", help="NCCL_DEBUG level, e.g. INFO."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Working directory of every rank."),
    sync: Optional[str] = typer.Option(
        None, "--sync", metavar="[DIR]",
        help="First send DIR (default: this folder; .gitignore/.clustertoolignore honoured) to the same path "
             "on the job's nodes, incremental and verified; the job runs there."),
    sync_to: Optional[str] = typer.Option(None, "--sync-to", metavar="PATH",
                                          help="With --sync: the folder on the nodes (default: DIR's own path)."),
    name: Optional[str] = typer.Option(None, "--name", help="A name for the job."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Stream the log; exit with the job's code. Ctrl-C detaches."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the mpirun command and exit."),
    oversubscribe: bool = typer.Option(False, "--oversubscribe", help="Allow more ranks than slots."),
    allow_concurrent: bool = typer.Option(
        False, "--allow-concurrent", help="Start even if another job runs on these nodes."),
    tag_output: bool = typer.Option(
        True, "--tag-output/--no-tag-output", help="Show each line as [job,rank]<stream>:text (or bare)."),
    hang_timeout: Optional[str] = typer.Option(
        None, "--hang-timeout", metavar="TIME",
        help="When no rank has written a line and no rank used over 1% of a core for TIME (10m, 1h, 90s), save "
             "every rank's stack in the job's folder and show the job as hung? in `jobs`."),
    hang_action: str = typer.Option("keep", "--hang-action", metavar="keep|kill",
                                    help="With --hang-timeout: keep the hung job running (default) or kill it."),
    restarts: int = typer.Option(
        0, "--restarts", metavar="N",
        help="When the job fails, stop what is left of it and start the same command again (same job id), up to "
             "N times; every rank gets CLUSTERTOOL_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0, then 1, 2 ...) "
             "to resume from its own checkpoint. The loop runs on the leader (your laptop may close). No restart "
             "after `kill`, nor when a node stopped answering (cordon or replace it; --replace-failed does)."),
    restart_on_exit_codes: Optional[str] = typer.Option(
        None, "--restart-on-exit-codes", metavar="CODES",
        help="With --restarts: restart only on these exit codes, e.g. 1,137. The job's exit code is the first "
             "failing rank's, or 128+signal for a rank killed by a signal (137: SIGKILL, e.g. out of memory)."),
    replace_failed: bool = typer.Option(
        False, "--replace-failed",
        help="With --restarts: when a node is lost (or gets a spot notice), the leader waits for it to be replaced, "
             "then restarts the job on the new node (same job id). The replacement runs where your cloud "
             "credentials are: with --follow this command does it, else leave `clustertool recover` running."),
    replace_wait: Optional[str] = typer.Option(
        None, "--replace-wait", metavar="TIME",
        help="With --replace-failed: how long the leader waits for the replacement before it stops the job "
             "(default 10m)."),
    after: Optional[str] = typer.Option(
        None, "--after", metavar="JOB",
        help="A Slurm cluster: queue this job now, start it once JOB (id or name) has ended, however it ended."),
    on_preempt_signal: Optional[str] = typer.Option(
        None, "--on-preempt-signal", metavar="SIG",
        help="Spot clusters: the signal every rank gets when a node's spot interruption notice comes (default "
             "TERM; e.g. USR1 for a script that checkpoints on it); that node then counts as lost."),
    checkpoint_dir: Optional[str] = typer.Option(
        None, "--checkpoint-dir", metavar="DIR",
        help="Where the job checkpoints: every rank gets CLUSTERTOOL_CHECKPOINT_DIR=DIR. With --restarts, put it on "
             "a shared filesystem (`up --shared-fs`), else a lost leader restarts the job from step 0 (run warns)."),
    no_record: bool = typer.Option(
        False, "--no-record", help="No watch recorder beside the job (by default the leader samples the job's nodes "
                                   "every 5 s into its folder: what `clustertool report JOB` draws)."),
    json_output: bool = JsonOpt,
) -> None:
    """Run a job on the cluster, detached on the leader (survives your connection).

    Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, NNODES, MASTER_ADDR and
    MASTER_PORT (free, chosen per job), so a torch.distributed script runs as it is. Under torchrun,
    accelerate, deepspeed or process, the leader starts one launcher per node, all at once over
    ssh, and stops the whole job when one fails. mpirun runs on the leader in tmux (setsid without tmux)
    with -bind-to none -map-by slot, TCP
    on the cluster subnet, one rank per slot unless --np/--per-node say otherwise; every rank gets
    CLUSTERTOOL_JOB=<id> and PYTHONUNBUFFERED=1 (live logs). Each rank's output goes to its own
    files on its node; `logs` and --follow show them as whole lines, tagged [job,rank]<stream>:.
    One quoted argument is split like a shell line. Prints the job id; `logs -f ID` follows it,
    `kill ID` stops it everywhere. `--sync [DIR]` sends your local code first (only what changed).
    `--restarts N` starts a failed job again from the leader; `jobs` lists each attempt and its cause.
    """
    from clustertool.cli import progress
    from clustertool.core.durations import parse_duration
    from clustertool.jobs import launch
    from clustertool.jobs.jobrequests import RunRequest, parse_exit_codes

    request = RunRequest.of(
        _strip_dashes(command), nodes=nodes, name=name, launcher=launcher, np=np, per_node=per_node, env=export,
        mpi_args=mpi_arg, plugin=plugin, nccl_debug=nccl_debug, workdir=workdir, sync=sync, sync_to=sync_to,
        oversubscribe=oversubscribe, allow_concurrent=allow_concurrent, tag_output=tag_output,
        hang_timeout=parse_duration(hang_timeout, "--hang-timeout") if hang_timeout else None,
        hang_action=hang_action, restarts=restarts, restart_on_exit_codes=parse_exit_codes(restart_on_exit_codes),
        replace_failed=replace_failed, on_preempt_signal=on_preempt_signal,
        replace_wait=parse_duration(replace_wait, "--replace-wait") if replace_wait else None,
        fusion_mb=fusion_mb, cycle_ms=cycle_ms, timeline=timeline, autotune=autotune, after=after,
        record=not no_record, checkpoint_dir=checkpoint_dir)
    session = open_session(cluster, json_output)
    started = None
    try:  # a Ctrl-C once the job has started (following it, or at any instant before) leaves it running, and says so
        with progress.NodeProgress([], enabled=not json_output and sync is not None) as bars:  # --sync's copy
            started = launch.run(session, request, dry_run=dry_run, on_progress=bars.update)
        _after_start(session, started, json_output=json_output, follow=follow, dry_run=dry_run, sync=sync)
    except KeyboardInterrupt:
        if started is None or dry_run:
            raise  # the job was not started (or it was a dry run): interrupted
        job_id = started.job.id
        sys.stderr.write(f"detached; job {job_id} keeps running (`clustertool logs -f {job_id}`, "
                         f"`clustertool kill {job_id}`)\n")
        raise typer.Exit(130) from None


def _after_start(session: Any, started: Launch, *, json_output: bool, follow: bool, dry_run: bool,
                 sync: Optional[str]) -> None:
    """`run`'s answer once launch.run returned (in the open session): the dry run's command, or the started job."""
    from clustertool.cli import progress, render

    if dry_run:
        if json_output:
            render.print_json(started.to_dict())
        else:
            if started.sync is not None:
                render.info(f"would sync {started.sync[0]} to {started.sync[1]} on {len(started.job.nodes)} node(s)")
            render.info(f"the ranks' python: {started.python}")
            typer.echo(shlex.join(started.argv))
            for node, argv in started.node_commands or []:
                typer.echo(f"  {node}: {shlex.join(argv)}")
        return
    job = started.job
    if json_output and not follow:
        render.print_json(started.to_dict())
        return
    if started.synced is not None:
        render.info(f"synced {sync or '.'} -> {started.synced.dest}: {progress.copy_summary(started.synced)}")
    if job.slurm:
        sys.stderr.write(f"job {job.id} queued in Slurm as job {job.slurm['id']} ({job.np} ranks, {job.launcher}); "
                         f"`clustertool jobs` shows the queue, `clustertool logs -f {job.id}` follows it\n")
    else:
        sys.stderr.write(f"job {job.id} started on {job.leader} ({job.np} ranks, {job.launcher}, in {job.detached}); "
                         f"`clustertool logs -f {job.id}`\n")
        if job.replace_failed:
            sys.stderr.write(_replacing_line(session.record.options, session.name, follow) + "\n")
    if follow:
        raise typer.Exit(_follow(session.name, job))
    typer.echo(job.id)


def _replacing_line(options: dict, name: str, follow: bool) -> str:
    """Who replaces a lost node of a --replace-failed job: the cluster's controller, else `recover` (or this command
    with --follow)."""
    if options.get("controller"):
        return "a lost node: the cluster's controller replaces it (no `clustertool recover` needed)"
    if follow:
        return "a lost node: this command replaces it while it follows the job"
    return f"a lost node: `clustertool recover -c {name}` replaces it while it runs (or `up --controller`)"


def _duration(job: JobRecord) -> str:
    end = job.ended or (time.time() if job.state == "running" else job.started)
    seconds = max(0, int(end - job.started))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _state_text(job: JobRecord) -> str:
    from clustertool.jobs.failure import text

    lost = getattr(job, "servers_lost", None)
    gone = f", reduction server {', '.join(lost)} gone" if lost else ""
    why = text(getattr(job, "failure", None))
    if job.state == "failed":
        return f"failed ({why or f'exit {job.exit_code}'}{gone})" + _restarted(job)
    if job.state == "lost" and why:
        return f"lost ({why})"
    slurm = getattr(job, "slurm", None) or {}
    if job.state == "pending":
        return f"pending ({slurm.get('reason') or 'None'})"
    if job.state == "killed" and job.exit_code is not None:
        return f"killed (exit {job.exit_code}{gone})" + _restarted(job)
    hung = getattr(job, "hung", None)
    if job.state == "running" and hung:
        quiet = max(0, int(time.time() - float(hung.get("since", time.time()))))
        return f"hung? (no output, no CPU for {quiet}s{gone})"
    return job.state + (f" ({gone[2:]})" if gone else "") + _restarted(job)


def _restarted(job: JobRecord) -> str:
    """`` (1 restart: exit code 137)`` for a job whose restart loop started it again."""
    done = [a for a in getattr(job, "attempts", None) or [] if a.get("end") is not None and a.get("cause")]
    if not job.attempts or len(job.attempts) < 2:
        return ""
    n = len(job.attempts) - 1
    return f" ({n} restart{'s' if n > 1 else ''}: {done[-1].get('cause') if done else '?'})"


def jobs(cluster: Optional[str] = ClusterOpt, json_output: bool = JsonOpt) -> None:
    """Jobs of the cluster with their state and duration."""
    from clustertool.cli import render
    from clustertool.cluster import blockend
    from clustertool.jobs import flightfold, slurmjobs
    from clustertool.jobs.stacks import fold, saved_ranks

    session = open_session(cluster)
    all_jobs, queue = slurmjobs.refresh(session)
    hung_ranks = {j.id: saved_ranks(session, j) for j in all_jobs if j.state == "running" and j.hung}
    hung = {job_id: fold(found) for job_id, found in hung_ranks.items()}
    if json_output:
        render.print_json({"jobs": [dict(j.to_dict(), **({"hung_stacks": [g.to_dict() for g in hung[j.id]],
                                                        "hung_flight": flightfold.fold(hung_ranks[j.id])}
                                                       if j.id in hung else {})) for j in all_jobs],
                           **({"queue": [q.to_dict() for q in queue]} if queue else {})})
        return
    if queue:  # Slurm's queue: every user's jobs, pending ones with Slurm's reason
        typer.echo("Slurm queue:")
        render.plain_table(["slurm id", "job", "user", "state", "reason / nodes", "nodes", "name"],
                           [(q.slurm.id, q.job or "", q.slurm.user, q.slurm.state,
                             q.slurm.reason if q.slurm.pending else q.slurm.nodelist, q.slurm.nodes,
                             render.clip(q.slurm.name)) for q in queue])
        typer.echo("")
    if not all_jobs:
        typer.echo("no jobs")
        return
    render.plain_table(["id", "name", "state", "started", "duration", "ranks", "nodes", "command"],
                 [(j.id, j.name or "", _state_text(j), time.strftime("%m-%d %H:%M:%S", time.localtime(j.started)),
                   _duration(j), j.np, len(j.nodes), render.clip(render.command_line(j.command))) for j in all_jobs])
    for j in all_jobs:  # jobs run with --restarts: each attempt, its cause, and why the loop stopped
        if len(j.attempts) > 1 or (j.attempts and j.restart_verdict and j.state != "succeeded") or j.waiting:
            typer.echo(f"\njob {j.id} attempts (--restarts {j.restarts}):")
            for a in j.attempts:
                typer.echo(f"  {_attempt_line(a)}")
            if j.restart_verdict:
                typer.echo(f"  {j.restart_verdict}")
            elif j.waiting and j.state == "running":
                typer.echo(f"  {_waiting_line(j.waiting)}")
    for line in blockend.jobs_lines(all_jobs):  # jobs the leader warned before the machines went
        typer.echo(f"\n{line}")
    for job_id, groups in hung.items():   # where the hung jobs' ranks are (the stacks saved at the time)
        typer.echo(f"\njob {job_id} hung? where its ranks were (`clustertool stacks {job_id}` for now):")
        for group in groups:
            typer.echo(f"  {group.label}: {group.summary}")
        for line in flightfold.fold(hung_ranks[job_id]):
            typer.echo(f"  {line}")


def _waiting_line(w: dict) -> str:
    left = max(0, int(float(w.get("until") or 0) - time.time()))
    who = w.get("replacer") or "`clustertool recover`"
    return f"waiting for the replacement of {', '.join(w.get('nodes') or [])} ({left}s left; {who} replaces it)"


def _attempt_line(a: dict) -> str:
    def at(t: float | str | None) -> str:
        return time.strftime("%H:%M:%S", time.localtime(float(t))) if t else "..."

    how = "running" if a.get("end") is None else ("exit code 0" if a.get("code") == 0 else a.get("cause") or "?")
    replaced = a.get("replaced") or {}
    if replaced.get("by"):
        how += f"; {', '.join(replaced.get('nodes') or [])} replaced by {replaced['by']}"
    return f"attempt {a.get('attempt')}: {at(a.get('start'))}-{at(a.get('end'))} {how}"


def logs(
    job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                        help="Job id, unique prefix or name (default: the latest job)."),
    cluster: Optional[str] = ClusterOpt,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    node: Optional[str] = typer.Option(None, "--node", help="Only the ranks that ran on this node (and mpirun's "
                                                             "own lines)."),
    rank: Optional[str] = typer.Option(None, "--rank", "-r", metavar="R",
                                       help="Only these ranks' lines: 3, 0,2 or 4-7."),
    lines: Optional[int] = typer.Option(
        None, "--tail", "-n", metavar="N",
        help="Only the last N lines of each rank's stdout and stderr (and of mpirun's own)."),
    attempt: Optional[int] = typer.Option(
        None, "--attempt", metavar="K",
        help="A job run with --restarts: only attempt K's rank lines (1: the first; default: every attempt, "
             "each after a separator line, then mpirun's and the restart loop's own lines)."),
) -> None:
    """Show a job's output in whole lines, [job,rank]<stream>:text, from every node it ran on.

    Without -f: rank by rank (stdout, then stderr), then mpirun's own lines. With -f: lines as
    they complete, until the job ends (exit code: the job's), across restarts. A line is never cut: a partial last
    line waits for its newline or the job's end. After a restart (run --restarts) attempt K's lines are
    tagged [K,rank].
    """
    from clustertool.jobs.jobrequests import LogsRequest
    from clustertool.jobs.logs import show

    request = LogsRequest(job, follow=follow, node=node, ranks=rank, tail=lines, attempt=attempt)
    try:
        code = show(open_session(cluster), request, _echo_line, warn=_warn)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    if follow and code is not None:
        raise typer.Exit(code)


def attach(job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                              help="Job id, unique prefix or name (default: the latest running job)."),
           cluster: Optional[str] = ClusterOpt) -> None:
    """Attach to the job's tmux session on the leader (detach again with Ctrl-b d)."""
    from clustertool.core.errors import UsageError
    from clustertool.jobs.logs import find_job
    from clustertool.remote.transport import session_argv

    c, j = find_job(open_session(cluster), job, running=True)
    if j.state != "running":
        raise UsageError(f"job {j.id} is not running ({j.state})", hint=f"`clustertool logs {j.id}`")
    if j.detached != "tmux":
        raise UsageError(f"job {j.id} runs without tmux on the leader", hint=f"`clustertool logs -f {j.id}`")
    argv = session_argv(c.name, c.node(j.leader), f"tmux attach -t ct-{j.id}", tty=True)
    os.execvp(argv[0], argv)


def kill(
    job: Optional[str] = typer.Argument(None, metavar="[JOB]", autocompletion=complete_job,
                                        help="Job id (default: the one running job)."),
    cluster: Optional[str] = ClusterOpt,
    signal: str = typer.Option("TERM", "--signal", "-s", help="First signal: TERM (default), INT, KILL ..."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds between the signal and KILL."),
    all_python: bool = typer.Option(False, "--all-python", help="Blunt fallback: pkill -9 python on every node."),
    nodes: Optional[str] = NodesOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Stop a job's processes on every node (by job, not by name) and verify nothing is left."""
    import clustertool.jobs.kill
    from clustertool.cli import render
    from clustertool.jobs.jobrequests import KillRequest

    request = KillRequest(job, signal=signal, grace=grace, all_python=all_python, nodes=nodes)
    result = clustertool.jobs.kill.run(open_session(cluster), request)
    if json_output:
        render.print_json(result.to_dict())
    else:
        if result.job:
            sys.stderr.write(f"job {result.job.id}: {_state_text(result.job)}\n")
        render.plain_table(["node", "signaled", "forced (KILL)", "remaining", "gpu", "error"],
                     [(n.node, len(n.signaled), len(n.forced), " ".join(n.remaining) or "0", n.gpu, n.error or "")
                      for n in result.nodes])
    raise typer.Exit(0 if result.clean else 1)


def reboot(cluster: Optional[str] = ClusterOpt, nodes: Optional[str] = NodesOpt,
           timeout: float = typer.Option(600, "--timeout", help="Seconds to wait for SSH."),
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask.")) -> None:
    """Reboot nodes (local: restart the node's processes and sshd), wait for SSH, re-check."""
    from clustertool.core import nodeset
    from clustertool.jobs import manage

    session = open_session(cluster)  # a cluster that does not exist is said before anything is asked
    name = session.name
    nodeset.select(session.record, nodes)  # and so is a node it does not have
    if not yes:
        confirm(f"Reboot {nodes or 'all nodes'} of {name!r}? Running jobs there die.", what=f"reboot {name!r}",
                kept=f"not rebooted: {nodes or 'every node'} of {name!r} kept running",
                unasked=f"clustertool reboot -c {name}{' --nodes ' + nodes if nodes else ''} --yes")
    done = manage.reboot(session, nodes, timeout=timeout)
    typer.echo(f"rebooted {nodeset.fold(n.name for n in done)}; SSH and the mesh answer")


def clean(cluster: Optional[str] = ClusterOpt, nodes: Optional[str] = NodesOpt,
          logs_: bool = typer.Option(False, "--logs", help="Remove logs of finished jobs."),
          jobs_: bool = typer.Option(False, "--jobs", help="Remove whole records of finished jobs."),
          ) -> None:
    """Remove finished jobs' logs and/or records on every node (running jobs are kept)."""
    from clustertool.core import nodeset
    from clustertool.jobs import manage

    if not logs_ and not jobs_:
        logs_ = jobs_ = True
    result = manage.clean(open_session(cluster), logs=logs_, jobs=jobs_, selection=nodes)
    removed = {line.split()[1] for r in result.results for line in r.stdout.splitlines() if line.startswith("removed ")}
    bad = [r for r in result.results if not r.ok]
    typer.echo(f"removed {'records' if jobs_ else 'logs'} of {len(removed)} job(s) on "
               f"{nodeset.fold(r.node for r in result.results if r.ok)}")
    for r in bad:
        sys.stderr.write(f"{r.node}: {r.reason}\n")
    raise typer.Exit(result.exit_code)


def fetch(job: str = typer.Argument(..., metavar="JOB", autocompletion=complete_job, help="Job id."),
          path: str = typer.Argument(..., metavar="PATH",
                                     help="File or folder on the leader (relative: to the job's workdir)."),
          cluster: Optional[str] = ClusterOpt,
          to: Optional[str] = typer.Option(None, "--to", help="Local folder (default ./JOB) or s3://BUCKET/PREFIX."),
          ) -> None:
    """Copy a job's output back from the leader (or upload it from the leader to S3)."""
    from clustertool.jobs import manage

    typer.echo(manage.fetch(open_session(cluster), job, path, to))


def register(app: typer.Typer) -> None:
    app.command("run", cls=RunCommand, context_settings={"allow_interspersed_args": False})(run)
    app.command("jobs")(jobs)
    app.command("logs")(logs)
    app.command("attach")(attach)
    app.command("kill")(kill)
    app.command("reboot")(reboot)
    app.command("clean")(clean)
    app.command("fetch")(fetch)
