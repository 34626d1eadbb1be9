"""A job's Slurm batch script, as a pure function of its plan (jobs/slurmrun.py submits it with sbatch).

The script runs on the first node of the allocation Slurm gives the job, which is known only then: it
finds its nodes (``SLURM_JOB_NODELIST``), their addresses (the cluster's own, written in), the master's
address and a port free there, and exports the variables every rank gets (RANK ... come from the launcher
or the job agent, as without Slurm).  Then one step starts the ranks:

* ``mpirun`` inside the allocation (Open MPI reads it and starts its daemons with srun): no host list,
  one rank per task slot, each rank's output to its own files on its node, as always;
* every other launcher: ``srun`` starts the job agent once per node (nodeprogs/jobagent.py, put on every
  node of the allocation by a first step), which starts that node's launcher or processes.

``--kill-on-bad-exit``: one failing task ends the step (fail-fast).  The job's exit code is the first
failing rank's (srun's own word for it), not the highest of the tasks it then stopped.  ``--restarts N``:
a failed attempt (not a cancelled one) requeues the job (``scontrol requeue``) while fewer than N have
been; each attempt's exit code is kept in the job's Slurm comment (``ct:7,0``), where the waiter on the
leader reads it.  A node's death requeues the job by Slurm's own rule (``--requeue``).
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from clustertool.core.jobpaths import JOB_ENV
from clustertool.jobs.mpirun import VAR_RE

OUT = "$CT_OUT"  # the attempt's output folder, set by the script (the first attempt's is the job's own)
NNODES = "$SLURM_NNODES"  # the allocation's node count (a step of one task per node says so: srun takes
# SLURM_NTASKS, the job's ranks, from the batch environment otherwise)
PER_NODE = ["srun", f"--nodes={NNODES}", f"--ntasks={NNODES}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
STEP_ENV = "CLUSTERTOOL_SLURM_STEP"  # marks the step's processes (and nothing else) for the cleanup after it
DYNAMIC = ("MASTER_ADDR", "MASTER_PORT", "CLUSTERTOOL_NODE_IPS")  # known only once the job runs
# The SLURM_* variables a node launcher's ranks keep: the task-level ones (SLURM_NTASKS, SLURM_PROCID ...)
# describe the agents, one per node, and would mislead a script that reads them (Lightning, for one)
KEPT_SLURM = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT",
              "SLURM_CONF", "SLURM_JOB_PARTITION", "SLURM_SUBMIT_DIR")


@dataclass(frozen=True)
class BatchJob:
    job_id: str
    job_dir: str                      # on every node (the same home everywhere)
    step: Sequence[str]               # mpirun's argv (OUT marks its output folder), or the agent's
    node_launcher: bool               # srun starts the job agent on each node
    addresses: dict[str, str]         # Slurm node name -> the address ranks reach it at
    env: dict[str, str] = field(default_factory=dict)  # exported before the step (values)
    passed: Sequence[str] = ()        # names passed as they are (the submitting shell's value)
    output_dir: str = ""              # the ranks' output folder (attempt k > 0: OUT/attempt.k)
    workdir: str | None = None
    restarts: int = 0
    restart_codes: Sequence[int] | None = None
    agent_files: dict[str, str] = field(default_factory=dict)  # file name in the job folder -> text
    fallback_port: int = 29500
    cleanup: bool = True  # after the step: stop what it left on every node (cleanup_program)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


EXPANDED = (OUT, NNODES)  # the only variables a step's word may hold: the script expands them


def _word(word: str) -> str:
    """One word for the shell: quoted, except the variables of EXPANDED in it, which the script expands."""
    for var in EXPANDED:
        if var in word:
            head, _, tail = word.partition(var)
            return f'{_word(head) if head else ""}"{var}"{_word(tail) if tail else ""}'
    return shlex.quote(word)


def step_line(words: Sequence[str]) -> str:
    return " ".join(_word(w) for w in words)


def _addresses(job: BatchJob) -> list[str]:
    cases = [f"  {shlex.quote(name)}) echo {shlex.quote(addr)} ;;" for name, addr in sorted(job.addresses.items())]
    return ['addr() { case "$1" in', *cases, '  *) getent hosts "$1" | awk \'{ print $1; exit }\' | grep . '
            '|| echo "$1" ;;', "esac; }"]


def _environment(job: BatchJob) -> list[str]:
    """What the step inherits (the job's marker, CLUSTERTOOL_JOB, only the step itself: see ``_cleanup``)."""
    lines = ['export CLUSTERTOOL_RESTART_COUNT="$k"']
    for key, value in job.env.items():
        if key == JOB_ENV:
            continue
        if not VAR_RE.match(key):
            raise ValueError(f"not a variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += [f"export {name}" for name in job.passed if VAR_RE.match(name)]
    return lines


def _where(job: BatchJob) -> list[str]:
    free = "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"
    return [
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST") || exit 1',
        'MASTER_ADDR=$(addr "$(echo "$hosts" | head -n 1)")',
        f"MASTER_PORT=$({free} 2>/dev/null || echo {job.fallback_port})",
        'CLUSTERTOOL_NODE_IPS=$(for h in $hosts; do addr "$h"; done)',
        "export MASTER_ADDR MASTER_PORT CLUSTERTOOL_NODE_IPS",
    ]


def _agent_step(job: BatchJob) -> list[str]:
    """The job's files (the agent and its plan) on every node of the allocation, by one step."""
    if not job.agent_files:
        return []
    names = list(job.agent_files)
    writes = " && ".join(f'printf %s "${i + 2}" | base64 -d > "$1/{name}.$$" && mv -f "$1/{name}.$$" "$1/{name}"'
                         for i, name in enumerate(names))
    program = (f'mkdir -p "$1/ranks" "$1/exits" "$1/out" && {writes}'
               + (' && chmod 755 "$1/jobagent.py"' if "jobagent.py" in names else ""))  # torchrun --no-python runs it
    args = " ".join(shlex.quote(_b64(job.agent_files[n])) for n in names)
    return [f"{step_line(PER_NODE)} sh -c {shlex.quote(program)} ct-setup \"$d\" "
            f"{args} || {{ echo 'clustertool: could not put the job agent on every node' >&2; exit 1; }}"]


def cleanup_program(job_id: str, tenths: int = 20) -> str:
    """Stop, on this node, every process the step's marker (``STEP_ENV``) names: TERM, then KILL after
    ``tenths`` tenths of a second.  Only the step's processes carry it: not this program, not the batch
    script, and not the leader's waiter (whose CLUSTERTOOL_JOB marker `jobs` reads)."""
    marker = shlex.quote(f"{STEP_ENV}={job_id}")
    find = f"grep -l -a -z -x {marker} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3"
    return "\n".join([
        f"left() {{ for p in $({find}); do [ \"$p\" != $$ ] && echo \"$p\"; done; }}",
        "first=$(left)",
        '[ -z "$first" ] && exit 0',
        "# shellcheck disable=SC2086  # a list of pids",
        "kill -TERM $first 2>/dev/null",
        f'i=0; while [ $i -lt {int(tenths)} ] && [ -n "$(left)" ]; do sleep 0.1; i=$((i + 1)); done',
        "rest=$(left)",
        "# shellcheck disable=SC2086  # a list of pids",
        '[ -n "$rest" ] && kill -KILL $rest 2>/dev/null',
        'echo "stopped $(echo $first | wc -w) process(es) the step left on $(uname -n)"',
    ]) + "\n"


def _cleanup(job: BatchJob) -> list[str]:
    """After the step, on every node of the allocation: what is left of the step's processes (a rank's own
    children outlive it where Slurm tracks processes by their parents, proctrack/linuxproc) is stopped."""
    if not job.cleanup:
        return []
    return [f"cleanup={shlex.quote(cleanup_program(job.job_id))}",
            f'{step_line(PER_NODE)} sh -c "$cleanup" >> "$d/cleanup.out" 2>&1 || true']


def _restart(job: BatchJob) -> list[str]:
    """A failed attempt requeues the job while fewer than ``restarts`` attempts failed (exit codes kept)."""
    codes = " ".join(str(c) for c in job.restart_codes or ())
    wanted = f'case " {codes} " in *" $code "*) ;; *) again=0 ;; esac' if job.restart_codes else ":"
    return [
        'prev=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o "Comment=ct:[0-9,]*" | cut -d: -f2)',
        'codes="${prev:+$prev,}$code"',
        'scontrol update JobId="$SLURM_JOB_ID" Comment="ct:$codes" >/dev/null 2>&1 || true',
        f'again=1; [ "$code" = 0 ] && again=0; [ -e "$d/killed" ] && again=0; {wanted}',
        'used=$(printf %s "$prev" | tr "," "\\n" | grep -c .)',
        f'if [ "$again" = 1 ] && [ "$used" -lt {int(job.restarts)} ]; then',
        f'  echo "clustertool: attempt $((k + 1)) failed with exit code $code: requeued (--restarts {job.restarts}, '
        f'$((used + 1)) used)" >&2',
        '  scontrol requeue "$SLURM_JOB_ID" && exit "$code"',
        "fi",
    ]


def batch_script(job: BatchJob) -> str:
    cd = f"cd {shlex.quote(job.workdir)}" if job.workdir else 'cd "$HOME"'
    lines = [
        "#!/bin/sh",
        f"# clustertool job {job.job_id} through Slurm (written by clustertool): run on the allocation's first node",
        f"d={shlex.quote(job.job_dir)}",
        # the job's folder exists on the leader only: Slurm's --output there would fail the launch elsewhere
        'mkdir -p "$d" || exit 1',
        'exec >> "$d/batch.out" 2>&1',
        "k=${SLURM_RESTART_COUNT:-0}",
        f"CT_OUT={shlex.quote(job.output_dir)}",
        '[ "$k" -gt 0 ] && CT_OUT="$CT_OUT/attempt.$k"',
        *_addresses(job),
        *_where(job),
        *_environment(job),
        f'{cd} || {{ echo "clustertool: cannot cd to the working directory" >&2; exit 1; }}',
        'echo "clustertool: Slurm job $SLURM_JOB_ID, attempt $((k + 1)), on $SLURM_JOB_NODELIST (master $MASTER_ADDR)"',
        *_agent_step(job),
        # the step's lines reach the batch output as they come; its code is kept beside them
        f'{{ env {JOB_ENV}={shlex.quote(job.job_id)} {STEP_ENV}={shlex.quote(job.job_id)} {step_line(job.step)}; '
        'echo $? > "$d/step.$k.rc"; } 2>&1 '
        '| tee "$d/step.$k.out"',
        'code=$(cat "$d/step.$k.rc" 2>/dev/null || echo 1)',
        # srun ends the other tasks when one fails: the job's code is that first one's, not theirs (143)
        'first=$(sed -n "s/.* task [0-9]*: Exited with exit code \\([0-9]*\\).*/\\1/p" "$d/step.$k.out" | head -n 1)',
        '[ "$code" != 0 ] && [ -n "$first" ] && code=$first',
        *_cleanup(job),
        *(_restart(job) if job.restarts else []),
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def agent_step(job_dir: str) -> list[str]:
    """The step of a node launcher's job: the job agent once per node, fail-fast."""
    return [*PER_NODE, "python3", f"{job_dir}/jobagent.py"]
