"""The restart loop of a job run with ``--restarts N``, on the leader inside the detached job (stdlib only).

launch.sh runs this program in place of mpirun.  Each attempt is the job's own mpirun command line,
with ``CLUSTERTOOL_RESTART_COUNT=k`` and ``TORCHELASTIC_RESTART_COUNT=k`` (k = 0 on the first attempt)
forwarded to every rank, its ranks' output in a folder of its own (attempt 0: ``out/1/rank.N``, as
every job; attempt k: ``out/attempt.k/1/rank.N``), and the leader's supervisor (supervise.py, where the
job has one) beside it.  When an attempt fails, mpirun has already stopped the rest of it (fail-fast),
or the supervisor did (a lost node, a hang with --hang-action kill); ``decide`` then says whether the
same command starts again.  Because the loop runs on the leader, the job restarts with the user's
laptop closed; no cloud call is made here (a lost node is not replaced: see ``decide``).

The job's exit code, per attempt, is mpirun's: the first failing rank's code, or 128+signal for a rank
killed by a signal (Open MPI's mpirun and the job agent both say it so).

``ARGS`` (prepended by the sender): ``job_dir``, ``argv`` (the job's mpirun argv), ``out`` (its rank
output folder), ``restarts`` (N), ``codes`` (the exit codes that restart, or null: any non-zero), ``nodes``
([name, address, ssh port] of the job's other nodes: each must answer before a restart).
Writes ``attempts.json`` in the job's folder (the attempts so far, and the verdict once it stopped)
and one ``clustertool:`` line per attempt in the job's log.  Its exit code is the last attempt's.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

RESTART_ENV = ("CLUSTERTOOL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
SUPERVISOR_WAIT_S = 30.0


def attempt_out(out, k):
    """Where attempt ``k``'s ranks write their output (attempt 0: the job's own folder)."""
    return out if k == 0 else f"{out}/attempt.{k}"


def attempt_argv(argv, out, k):
    """The job's mpirun argv for attempt ``k``: the restart count forwarded to every rank, the ranks'
    output in the attempt's own folder."""
    words = [w.replace(f"{out}:nocopy", f"{attempt_out(out, k)}:nocopy") if w == f"{out}:nocopy" else w
             for w in argv]
    forward = [x for name in RESTART_ENV for x in ("-x", name)]
    return words[:1] + forward + words[1:]


def exit_code(returncode):
    """Popen's returncode as a shell says it: the code, or 128+signal."""
    return returncode if returncode >= 0 else 128 - returncode


def decide(attempts, restarts, codes, killed=False, lost=None):
    """(start again?, why) after the last of ``attempts`` ({"code", "cause", "kind"} each) ended.

    Stops: on success; after `kill`; when a node was lost (the job's nodes are fixed and nothing here
    replaces one, so a restart would fail the same way: the user cordons or replaces the node); on an
    exit code not in ``codes``; when the N restarts are used up.  A hang stopped by --hang-action kill
    restarts whatever ``codes`` says (its code is only the stop signal's)."""
    last = attempts[-1]
    code = last.get("code")
    if code == 0:
        return False, "succeeded" + (f" on attempt {len(attempts)}" if len(attempts) > 1 else "")
    if killed:
        return False, "killed: no restart after `clustertool kill`"
    if lost:  # where a node can be replaced (a --replace-failed to come), that would happen here instead
        return False, (f"{lost} stopped answering: no restart without it (the job's nodes are fixed); "
                       f"`clustertool cordon {lost}` and run again on the others, or replace the node")
    if codes is not None and last.get("kind") != "hung" and code not in codes:
        wanted = ",".join(str(c) for c in codes)
        return False, f"exit code {code} is not in --restart-on-exit-codes {wanted}: no restart"
    used = len(attempts) - 1
    if used >= restarts:
        failed = [a.get("code") for a in attempts]
        if len(set(failed)) == 1:
            return False, (f"failed with exit code {code} {len(attempts)} times (--restarts {restarts}): "
                           "giving up")
        return False, f"failed {len(attempts)} times, every restart used (--restarts {restarts}): giving up"
    return True, f"restart {used + 1} of {restarts}"


def read_json(path):
    try:
        with open(path) as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def say(line):
    sys.stdout.write(f"clustertool: {line}\n")
    sys.stdout.flush()


def cause_of(d, code):
    """(cause text, kind, lost node) of an attempt that ended with ``code``."""
    lost = read_json(os.path.join(d, "lost"))
    if lost and lost.get("kind") == "hung":
        return "hung (stopped by --hang-action kill)", "hung", None
    if lost:
        return f"{lost.get('node')} lost", "lost", lost.get("node")
    if code >= 128:
        return f"exit code {code} (signal {code - 128})", "exit", None
    return f"exit code {code}", "exit", None


def answers(address, port, timeout=5.0):
    try:
        with socket.create_connection((address, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def silent_node(nodes):
    """The first of the job's other nodes whose ssh port takes no connection now (None: all answer)."""
    return next((n[0] for n in nodes if not answers(n[1], n[2])), None)


def start_supervisor(d):
    path = os.path.join(d, "supervise.py")
    if not os.path.exists(path):
        return None
    return subprocess.Popen([sys.executable, path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def end_supervisor(sup):
    """The supervisor ends by itself once mpirun is gone; wait for it (its ``lost`` must be written)."""
    if sup is None:
        return
    try:
        sup.wait(SUPERVISOR_WAIT_S)
    except subprocess.TimeoutExpired:
        sup.kill()
        sup.wait()


def set_aside(d, k):
    """What attempt ``k`` left in the job's folder that would be taken for the next one's."""
    keep = os.path.join(d, "attempts", str(k))
    os.makedirs(keep, exist_ok=True)
    for name in ("lost", "hung", "failure"):
        try:
            os.replace(os.path.join(d, name), os.path.join(keep, name))
        except OSError:
            pass


def run_attempt(args, k):
    d = args["job_dir"]
    for name in RESTART_ENV:
        os.environ[name] = str(k)
    proc = subprocess.Popen(attempt_argv(args["argv"], args["out"], k), stdin=subprocess.DEVNULL)
    with open(os.path.join(d, "mpirun.pid"), "w") as fh:
        fh.write(f"{proc.pid}\n")
    sup = start_supervisor(d)
    while True:
        try:
            code = exit_code(proc.wait())
            break
        except InterruptedError:
            continue
    end_supervisor(sup)
    return code


def main(args):
    d, restarts, codes = args["job_dir"], int(args["restarts"]), args.get("codes")
    state = {"restarts": restarts, "codes": codes, "attempts": [], "verdict": None}
    path = os.path.join(d, "attempts.json")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the tmux pane may close; the job goes on
    k = 0
    while True:
        attempt = {"attempt": k + 1, "restart_count": k, "start": time.time(), "end": None, "code": None,
                   "cause": None}
        state["attempts"].append(attempt)
        write_json(path, state)
        say(f"attempt {k + 1} of up to {restarts + 1} starting (CLUSTERTOOL_RESTART_COUNT={k})")
        code = run_attempt(args, k)
        cause, kind, lost = cause_of(d, code)
        if code != 0 and lost is None:  # mpirun may have given up on a dead node before the supervisor saw it
            lost = silent_node(args.get("nodes") or [])
            if lost is not None:
                cause, kind = f"{lost} lost", "lost"
        attempt.update(end=time.time(), code=code, cause=None if code == 0 else cause, kind=kind)
        again, why = decide(state["attempts"], restarts, codes, os.path.exists(os.path.join(d, "killed")), lost)
        if not again:
            state["verdict"] = why
            write_json(path, state)
            if k > 0 or code != 0:
                say(f"attempt {k + 1} ended: {attempt['cause'] or 'exit code 0'}; {why}")
            return code
        write_json(path, state)
        say(f"attempt {k + 1} ended: {cause}; {why}, same command, same job id")
        set_aside(d, k)
        k += 1


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    sys.exit(main(ARGS))  # noqa: F821
