"""Shell programs that run on the nodes for jobs: pure text builders, unit-tested.

All of them are POSIX sh, sent on ssh's stdin or as one quoted command line; every value
that comes from the user passes through ``shlex.quote`` (job ids are checked to be
``[a-z0-9-]`` first).  A job's files on a node live in ``~/.clustertool/jobs/<id>/``:

    launch.sh   the detached program (leader)      log       mpirun's output (leader)
    job.json    the job record (leader)            exit      mpirun's exit code, when done
    hostfile    the job's hostfile (leader)        killed    present once `kill` ran
    launch.pid  "pid ppid pgid sid" of launch.sh   ranks/    "<host>.<rank>": same, per rank
"""

from __future__ import annotations

import base64
import re
import shlex

from clustertool.errors import UsageError
from clustertool.jobs.mpirun import JOB_ENV, JOBS_DIR

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
MPI_COMMS = ("mpirun", "mpiexec", "orterun", "orted", "prted", "prterun", "hydra_pmi_proxy")


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


def launch_script(job_id: str, argv: list[str], workdir: str | None) -> str:
    """launch.sh: record its ids, run mpirun into the log, then record the exit code.

    The exit file is written only after the log pipe drained, so whoever sees ``exit``
    sees the whole log.
    """
    d = job_dir_sh(job_id)
    cd = f"cd {shlex.quote(workdir)}" if workdir else 'cd "$HOME"'
    return "\n".join([
        "#!/bin/sh",
        f"# clustertool job {job_id}",
        f"d={d}",
        'read -r p _ _ pp pg sid _ < /proc/$$/stat; echo "$p $pp $pg $sid" > "$d/launch.pid"',
        f'{cd} || {{ echo "clustertool: cannot cd to the working directory" >> "$d/log"; echo 1 > "$d/exit"; exit 1; }}',
        f'{{ {shlex.join(argv)}; echo $? > "$d/exit.tmp"; }} 2>&1 | tee -a "$d/log"',
        'mv "$d/exit.tmp" "$d/exit"',
        "",
    ])


def install_and_start_script(job_id: str, launch: str, hostfile: str, record_json: str,
                             prefer_tmux: bool = True) -> str:
    """Leader: write the job's files, then start launch.sh detached (tmux, else setsid).

    Prints ``launcher=tmux`` or ``launcher=setsid``.
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
        ': > "$d/log"',
        start,
        'sed -i "s/\\"launcher\\": \\"pending\\"/\\"launcher\\": \\"$l\\"/" "$d/job.json"',
        'echo "launcher=$l"',
        "",
    ])


def scan_script() -> str:
    """Any node: ids of clustertool jobs that have processes here, and the home directory."""
    return "\n".join([
        'echo "home=$HOME"',
        f"grep -a -z -o -h '^{JOB_ENV}=[a-z0-9-]*$' /proc/[0-9]*/environ 2>/dev/null "
        "| tr '\\0' '\\n' | sort -u | sed 's/^/running /'",
        "true",
    ])


def status_script() -> str:
    """Leader: one line per job directory:
    ``J id exit|- alive(0/1) killed(0/1) launched(0/1) ended-epoch b64(job.json)``."""
    return "\n".join([
        f'for d in "$HOME/{JOBS_DIR}"/*/; do',
        '  [ -f "$d/job.json" ] || continue',
        '  j=$(basename "$d"); code=-; alive=0; killed=0; started=0',
        '  [ -f "$d/exit" ] && code=$(cat "$d/exit")',
        '  [ -f "$d/killed" ] && killed=1',
        '  [ -f "$d/launch.pid" ] && started=1',
        '  if [ -f "$d/launch.pid" ]; then read -r p _ < "$d/launch.pid";',
        f'    grep -q -a -z -x "{JOB_ENV}=$j" /proc/$p/environ 2>/dev/null && alive=1; fi',
        '  ended=$(stat -c %Y "$d/exit" 2>/dev/null || echo 0)',
        '  echo "J $j ${code:--} $alive $killed $started $ended $(base64 -w0 < "$d/job.json")"',
        "done",
        "true",
    ])


def _procs_function(job_id: str) -> str:
    """Shell function ``procs``: pids of the job on this node (not zombies, not us).

    A process belongs to the job when it carries CLUSTERTOOL_JOB=<id> in its environment,
    shares a session recorded by launch.sh or by a rank wrapper on this node, or is the
    orted/prted parent recorded by a rank wrapper.
    """
    d = job_dir_sh(job_id)
    comms = "|".join(MPI_COMMS)
    return "\n".join([
        f"d={d}; host=$(uname -n)",
        "read -r _ _ _ _ _ mysid _ < /proc/$$/stat",
        "sids=; parents=",
        'for f in "$d/launch.pid" "$d/ranks/$host".*; do',
        '  [ -f "$f" ] || continue; read -r _ pp _ s < "$f"',
        '  [ "${s:-0}" -gt 1 ] && [ "$s" != "$mysid" ] && sids="$sids $s"',
        '  case "$(cat /proc/$pp/comm 2>/dev/null)" in ' + comms + ') parents="$parents $pp";; esac',
        "done",
        "procs() {",
        f"  {{ grep -l -a -z -x '{JOB_ENV}={job_id}' /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3",
        '    [ -n "$sids" ] && ps -e -o pid=,sid=,stat= | awk -v s="$sids" '
        "'BEGIN{n=split(s,a);for(i=1;i<=n;i++)w[a[i]]=1} ($2 in w) && $3 !~ /^Z/ {print $1}'",
        '    for p in $parents; do [ -d /proc/$p ] && echo $p; done',
        "  } | sort -un | while read -r p; do",
        '    [ "$p" = "$$" ] && continue',
        '    case "$(cut -d" " -f3 /proc/$p/stat 2>/dev/null)" in Z|"") continue;; esac',
        '    echo $p',
        "  done",
        "}",
    ])


def kill_script(job_id: str, signal: str = "TERM", grace: float = 10.0, mark: bool = True) -> str:
    """Any node of the job: signal its processes, wait ``grace``, KILL what is left, verify.

    Prints ``signaled PIDS``, ``forced PIDS``, ``remaining PID:COMM ...`` and, where
    nvidia-smi exists, ``gpu PID:MiB ...`` for killed pids that still hold GPU memory.
    """
    if signal not in ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "QUIT"):
        raise UsageError(f"--signal {signal!r}: use TERM, INT, HUP, QUIT, USR1, USR2 or KILL")
    tenths = max(0, int(round(grace * 10)))
    lines = [_procs_function(job_id)]
    if mark:
        lines.append('[ -d "$d" ] && touch "$d/killed"')
    lines += [
        "first=$(procs | tr '\\n' ' ')",
        f'[ -n "$first" ] && kill -{signal} $first 2>/dev/null',
        'echo "signaled $first"',
        "i=0",
        f'while [ $i -lt {tenths} ] && [ -n "$(procs)" ]; do sleep 0.1; i=$((i+1)); done',
        "left=$(procs | tr '\\n' ' ')",
        '[ -n "$left" ] && kill -KILL $left 2>/dev/null',
        'echo "forced $left"',
        "i=0; while [ $i -lt 30 ] && [ -n \"$(procs)\" ]; do sleep 0.1; i=$((i+1)); done",
        'echo "remaining $(for p in $(procs); do printf "%s:%s " $p "$(cat /proc/$p/comm 2>/dev/null)"; done)"',
        "if command -v nvidia-smi >/dev/null 2>&1; then",
        "  held=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null"
        " | awk -F', *' -v k=\" $first $left \" 'index(k, \" \" $1 \" \") {printf \"%s:%s \", $1, $2}')",
        '  echo "gpu checked $held"',
        "else echo 'gpu none'; fi",
    ]
    return "\n".join(lines) + "\n"


def list_script(job_id: str) -> str:
    """Any node: ``PID COMM`` of every process of the job here (for tests and doctor)."""
    return _procs_function(job_id) + '\nfor p in $(procs); do echo "$p $(cat /proc/$p/comm 2>/dev/null)"; done\n'


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
    action = 'rm -rf "$d"' if records else 'rm -f "$d/log"'
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
