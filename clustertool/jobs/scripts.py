"""Shell programs that run on the nodes for jobs: pure text builders, unit-tested.

All of them are POSIX sh, sent on ssh's stdin or as one quoted command line; the long ones
are files in nodeprogs/ (job_status.sh, kill.sh); every value that comes from the user passes
through ``shlex.quote`` (job ids are checked to be
``[a-z0-9-]`` first).  A job's files on a node live in ``~/.clustertool/jobs/<id>/``:

    launch.sh   the detached program (leader)      log       mpirun's own output (leader)
    job.json    the job record (leader)            exit      mpirun's exit code, when done
    hostfile    the job's hostfile (leader)        killed    present once `kill` ran
    launch.pid  "pid ppid pgid sid" of launch.sh   ranks/    "<host>.<rank>": same, per rank
    mpirun.pid  mpirun's pid                        exits/    "<host>.<rank>": how a rank ended (job agent)
    supervise.py  stops the job when a node         lost      which node stopped answering (supervisor)
                stops answering (leader)            failure   the first failed rank here (job agent)
    pane.py     shows the job in its tmux pane     out/      <job>/rank.<N>/std{out,err}: each rank's
                (leader)                                     output, on the rank's node
    restarts.py   the restart loop (run --restarts) attempts.json  its attempts and verdict (leader)
    spot.py     watches spot notices (leader)       replaced  the recovery loop's "go on" (--replace-failed)
    watchrec.py   records the job's samples (leader)  watch/    samples.jsonl: what `report` draws (leader)
    hung        the hang check's verdict (leader)   hangwatch  what its last look saw, and since when quiet
    fr/         the Flight Recorder's hook (py/) and the ranks' dumps: pipe.<pid>, dump.<pid> (node launchers)
    attempts/<k>/ what attempt k left (lost, hung, failure), set aside before the next one
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from typing import Sequence

from clustertool import nodeprogs
from clustertool.core.errors import UsageError
from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR, MPI_COMMS
from clustertool.nodeprogs import shell_script

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


def check_id(job_id: str) -> str:
    if not ID_RE.match(job_id or ""):
        raise UsageError(f"invalid job id {job_id!r}")
    return job_id


def job_dir_sh(job_id: str) -> str:
    """The job directory as a shell word (``$HOME`` expands on the node)."""
    return f'"$HOME/{JOBS_DIR}/{check_id(job_id)}"'


def _write_file(path_sh: str, text: str, mode: str | None = None) -> str:
    b64 = base64.b64encode(text.encode()).decode()
    line = f"printf %s {shlex.quote(b64)} | base64 -d > {path_sh}"
    return line + (f" && chmod {mode} {path_sh}" if mode else "")


def launch_script(job_id: str, argv: list[str], workdir: str | None, epilogue: Sequence[str] = (),
                  restarts: bool = False) -> str:
    """launch.sh: record its ids, run mpirun into the log, then record the exit code.

    The exit file is written only after the log is complete, so whoever sees ``exit`` sees the
    whole log.  In tmux, ``pane.py`` (when the job has one and python exists) shows the job's
    lines on the leader -- its ranks' and mpirun's -- whole, in the pane `attach` joins;
    otherwise the pane shows mpirun's output as it comes.  ``epilogue`` (shell lines) runs after
    mpirun and before the exit file (the job's reduction servers are stopped there).  With ``restarts``
    (run --restarts), restarts.py runs mpirun, once per attempt, and starts the supervisor beside each.
    """
    d = job_dir_sh(job_id)
    cd = f"cd {shlex.quote(workdir)}" if workdir else 'cd "$HOME"'
    # mpirun's pid in mpirun.pid: what the supervisor (supervise.py, where the job has one) stops
    mpirun = f'{{ {shlex.join(argv)} & echo $! > "$d/mpirun.pid"; wait $!; echo $? > "$d/exit.tmp"; }}'
    need_py: list[str] = []
    if restarts:
        mpirun = '{ "$rpy" "$d/restarts.py" & wait $!; echo $? > "$d/exit.tmp"; }'
        need_py = ['rpy=$(command -v python3 || command -v python) || { echo "clustertool: --restarts needs python3 '
                   'on the leader" >> "$d/log"; echo 1 > "$d/exit"; exit 1; }']
    return "\n".join([
        "#!/bin/sh",
        f"# clustertool job {job_id}",
        f"d={d}",
        'read -r p _ _ pp pg sid _ < /proc/$$/stat; echo "$p $pp $pg $sid" > "$d/launch.pid"',
        f'{cd} || {{ echo "clustertool: cannot cd to the working directory" >> "$d/log"; '
        'echo 1 > "$d/exit"; exit 1; }',
        *need_py,
        "pane=",
        'if [ -f "$d/supervise.py" ] && [ ! -f "$d/restarts.py" ] && py=$(command -v python3 || command -v python)'
        '; then',
        '  "$py" "$d/supervise.py" </dev/null >/dev/null 2>&1 &',
        "fi",
        'if [ -f "$d/spot.py" ] && [ ! -f "$d/restarts.py" ] && py=$(command -v python3 || command -v python); then',
        '  "$py" "$d/spot.py" </dev/null >/dev/null 2>&1 &',
        "fi",
        # the job's watch recorder (jobs/recorder.py): neither the job's mark nor its session (it is no process of
        # the job for kill, preflight or doctor); it ends by itself once the job has ended
        'if [ -f "$d/watchrec.py" ] && py=$(command -v python3 || command -v python); then',
        f'  env -u {JOB_ENV} setsid "$py" "$d/watchrec.py" </dev/null >/dev/null 2>&1 &',
        "fi",
        'if [ -n "${TMUX:-}" ] && [ -f "$d/pane.py" ] && py=$(command -v python3 || command -v python); then',
        '  "$py" "$d/pane.py" & pane=$!',
        "fi",
        f'if [ -n "$pane" ]; then {mpirun} >> "$d/log" 2>&1; else {mpirun} 2>&1 | tee -a "$d/log"; fi',
        *epilogue,
        'mv "$d/exit.tmp" "$d/exit"',
        '[ -z "$pane" ] || wait "$pane"',
        "",
    ])


def install_and_start_script(job_id: str, launch: str, hostfile: str, record_json: str,
                             prefer_tmux: bool = True, pane: bytes | None = None,
                             supervisor: bytes | None = None, hangstacks: bytes | None = None,
                             restarter: bytes | None = None, spot: bytes | None = None,
                             extra_files: dict[str, str] | None = None, before_start: Sequence[str] = (),
                             recorder: bytes | None = None) -> str:
    """Leader: write the job's files, then start launch.sh detached (tmux, else setsid).

    ``extra_files``: more files of the job's folder (name -> text); ``before_start``: shell lines run once
    they are written, before launch.sh starts (a Slurm job's ``sbatch``: the job starts only once queued).
    Prints ``detached=tmux`` or ``detached=setsid``.
    """
    d = job_dir_sh(job_id)
    env = f"env {JOB_ENV}={job_id}"
    tmux = f'tmux new-session -d -s ct-{job_id} -x 220 -y 50 "{env} sh \\"$d/launch.sh\\"" && l=tmux'
    setsid = f'{{ {env} setsid nohup sh "$d/launch.sh" </dev/null >/dev/null 2>&1 & }}; l=setsid'
    start = (f"if command -v tmux >/dev/null 2>&1; then {tmux}; else {setsid}; fi"
             if prefer_tmux else setsid)
    return "\n".join([
        "set -e",
        f"d={d}",
        'mkdir -p "$d/ranks"',
        _write_file('"$d/launch.sh"', launch, "755"),
        _write_file('"$d/hostfile"', hostfile),
        _write_file('"$d/job.json"', record_json),
        *([_write_file('"$d/pane.py"', pane.decode())] if pane else []),
        *([_write_file('"$d/supervise.py"', supervisor.decode())] if supervisor else []),
        *([_write_file('"$d/hangstacks.py"', hangstacks.decode())] if hangstacks else []),
        *([_write_file('"$d/restarts.py"', restarter.decode())] if restarter else []),
        *([_write_file('"$d/spot.py"', spot.decode())] if spot else []),
        *([_write_file('"$d/watchrec.py"', recorder.decode())] if recorder else []),
        *[_write_file(f'"$d/{name}"', text) for name, text in (extra_files or {}).items()],
        ': > "$d/log"',
        *before_start,
        start,
        'sed -i "s/\\"detached\\": \\"pending\\"/\\"detached\\": \\"$l\\"/" "$d/job.json"',
        'echo "detached=$l"',
        "",
    ])


def agent_install_script(job_id: str, agent_json: str) -> str:
    """Any node of a node-launcher job: the job agent (nodeprogs/jobagent.py), its plan, the warm launcher it
    starts for the next job (nodeprogs/warmlaunch.py), and the Flight Recorder's hook its ranks start with
    (nodeprogs/frhook.py as fr/py/sitecustomize.py)."""
    d = job_dir_sh(job_id)
    return "\n".join([
        "set -e",
        f"d={d}",
        'mkdir -p "$d/ranks" "$d/exits" "$d/fr/py"',
        _write_file('"$d/jobagent.py"', (nodeprogs.DIR / "jobagent.py").read_text(), "755"),
        _write_file('"$d/warmlaunch.py"', (nodeprogs.DIR / "warmlaunch.py").read_text()),
        _write_file('"$d/agent.json"', agent_json),
        _write_file('"$d/fr/py/sitecustomize.py"', (nodeprogs.DIR / "frhook.py").read_text()),
        "",
    ])


def rank_host() -> str:
    """Where nodeprogs/rankhost.py lives on every node, relative to the home: named by its content, so a node
    keeps one copy per version and a job never runs another's."""
    text = (nodeprogs.DIR / "rankhost.py").read_bytes()
    return f".clustertool/rankhost-{hashlib.sha256(text).hexdigest()[:12]}.py"


def rank_host_install() -> str:
    """Any node: the rank host, written once (a job's preflight, on every node of the job)."""
    path = f'"$HOME"/{shlex.quote(rank_host())}'
    write = _write_file('"$h.$$"', (nodeprogs.DIR / "rankhost.py").read_text())
    return f'h={path}; [ -f "$h" ] || {{ mkdir -p "$(dirname "$h")" && {write} && mv "$h.$$" "$h"; }} || true'


# A port nothing listens on now (the kernel's pick), for the job's MASTER_PORT.
FREE_PORT = ("python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])' "
             "2>/dev/null")


def scan_script(program: str | None = None, path: str | None = None, port: bool = True) -> str:
    """Any node: ids of clustertool jobs that have processes here, the home directory, a free port (``port``);
    with ``program``, ``missing=PROGRAM`` where the ranks (their PATH: ``path``, else the node's own) cannot
    find it."""
    return "\n".join([
        'echo "home=$HOME"',
        *([f'echo "port=$({FREE_PORT})"'] if port else []),
        f"grep -a -z -o -h '^{JOB_ENV}=[a-z0-9-]*$' /proc/[0-9]*/environ 2>/dev/null "
        "| tr '\\0' '\\n' | sort -u | sed 's/^/running /'",
        *([program_check(program, path)] if program else []),
        rank_host_install(),
        "true",
    ])


def program_check(program: str, path: str | None) -> str:
    """``missing=PROGRAM`` unless ``program`` runs there: found on ``path``, or an executable file by its full
    path (a path relative to the job's folder is not checked: the folder may not be there yet)."""
    quoted = shlex.quote(program)
    if "/" in program:
        found = f"test -x {quoted}" if program.startswith("/") else "true"
    else:
        found = f"command -v {quoted} >/dev/null 2>&1"
    if path is not None:
        found = f"(PATH={shlex.quote(path)}; {found})"
    return f"{found} || echo missing={quoted}"


def status_script() -> str:
    """Leader: nodeprogs/job_status.sh, one line per job directory:
    ``J id exit|- alive(0/1) killed(0/1) launched(0/1) ended-epoch b64(job.json)``."""
    return shell_script("job_status", JOBS_DIR=JOBS_DIR, JOB_ENV=JOB_ENV)


def _job_procs(job_id: str, action: str, signal: str = "TERM", grace: float = 0.0, mark: bool = False) -> str:
    return shell_script("kill", ACTION=action, JOB=check_id(job_id), JOBS_DIR=JOBS_DIR, JOB_ENV=JOB_ENV,
                        MPI_RE="|".join(MPI_COMMS), SIGNAL=signal, TENTHS=max(0, int(round(grace * 10))),
                        MARK=int(mark))


def kill_script(job_id: str, signal: str = "TERM", grace: float = 10.0, mark: bool = True) -> str:
    """Any node of the job (nodeprogs/kill.sh): signal its processes, wait ``grace``, KILL what is
    left, verify.

    A process belongs to the job when it carries CLUSTERTOOL_JOB=<id> in its environment,
    shares a session recorded by launch.sh or by a rank wrapper on this node, or is the
    orted/prted parent recorded by a rank wrapper.  Prints ``signaled PIDS``, ``forced PIDS``,
    ``remaining PID:COMM ...`` and, where nvidia-smi exists, ``gpu checked PID:MiB ...`` for
    killed pids that still hold GPU memory.
    """
    if signal not in ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "QUIT"):
        raise UsageError(f"--signal {signal!r}: use TERM, INT, HUP, QUIT, USR1, USR2 or KILL")
    return _job_procs(job_id, "kill", signal, grace, mark)


def list_script(job_id: str) -> str:
    """Any node: ``PID COMM`` of every process of the job here (for tests and doctor)."""
    return _job_procs(job_id, "list")


def follow_script(job_id: str, from_line: int = 1) -> str:
    """Leader: the log from ``from_line`` until launch.sh ends; then ``exit`` is complete."""
    d = job_dir_sh(job_id)
    return "\n".join([
        f"d={d}",
        'i=0; while [ ! -f "$d/launch.pid" ] && [ ! -f "$d/exit" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done',
        'p=$(cut -d" " -f1 "$d/launch.pid" 2>/dev/null)',
        f'if [ -n "$p" ] && [ ! -f "$d/exit" ]; then exec tail -n +{int(from_line)} -f -s 0.2 --pid="$p" "$d/log"; '
        f'else exec tail -n +{int(from_line)} "$d/log"; fi',
        "",
    ])


def read_exit_script(job_id: str) -> str:
    d = job_dir_sh(job_id)
    return f'cat {d}/exit 2>/dev/null || echo -'


def tail_script(job_id: str, lines: int | None) -> str:
    d = job_dir_sh(job_id)
    what = f"-n {int(lines)}" if lines else "-n +1"
    return f'tail {what} {d}/log'


def clean_script(keep: list[str], logs: bool, records: bool) -> str:
    """Any node: remove logs and/or whole directories of jobs, except the ``keep`` ids."""
    keep_words = " ".join(check_id(k) for k in keep)
    action = 'rm -rf "$d"' if records else 'rm -rf "$d/log" "$d/out"'
    if not (logs or records):
        raise UsageError("nothing to clean: say --logs and/or --jobs")
    return "\n".join([
        f'for d in "$HOME/{JOBS_DIR}"/*/; do',
        '  [ -d "$d" ] || continue; d=${d%/}; j=$(basename "$d")',
        f'  case " {keep_words} " in *" $j "*) echo "kept $j"; continue;; esac',
        f'  {action} && echo "removed $j"',
        "done",
        "true",
    ])
