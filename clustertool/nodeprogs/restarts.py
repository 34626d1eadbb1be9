"""The restart loop of a job run with ``--restarts N``, on the leader inside the detached job (stdlib only).

launch.sh runs this program in place of mpirun.  Each attempt is the job's own mpirun command line,
with ``CLUSTERTOOL_RESTART_COUNT=k`` and ``TORCHELASTIC_RESTART_COUNT=k`` (k = 0 on the first attempt)
forwarded to every rank, its ranks' output in a folder of its own (attempt 0: ``out/1/rank.N``, as
every job; attempt k: ``out/attempt.k/1/rank.N``), and the leader's supervisor (supervise.py, where the
job has one) beside it.  When an attempt fails, mpirun has already stopped the rest of it (fail-fast),
or the supervisor did (a lost node, a hang with --hang-action kill); ``decide`` then says whether the
same command starts again.  Because the loop runs on the leader, the job restarts with the user's
laptop closed; no cloud call is made here.  With ``--replace-failed`` a lost node (or one whose spot notice
came, nodeprogs/spot.py) is replaced by whoever holds the credentials: this loop writes ``waiting`` in
attempts.json (which nodes, until when) and waits for ``replaced`` in the job's folder, which the recovery
loop on the user's machine (jobs/recovery.py: `clustertool recover`, `run --follow --replace-failed`) or the
cluster's controller (controller/, ARGS ``replacer`` names it) writes once `replace` made the new nodes; then
the same command starts again on them.  Nobody within
``replace_wait`` seconds: the job stops and says so.

The job's exit code, per attempt, is mpirun's: the first failing rank's code, or 128+signal for a rank
killed by a signal (Open MPI's mpirun and the job agent both say it so).

``ARGS`` (prepended by the sender): ``job_dir``, ``argv`` (the job's mpirun argv), ``out`` (its rank
output folder), ``restarts`` (N), ``codes`` (the exit codes that restart, or null: any non-zero), ``nodes``
([name, address, ssh port] of the job's other nodes: each must answer before a restart), ``replace_failed``
(wait for a lost node's replacement), ``replace_wait`` (seconds to wait for it).
Writes ``attempts.json`` in the job's folder (the attempts so far, and the verdict once it stopped;
one already there, written by the recovery loop that started the job again on a new leader, is continued)
and one ``clustertool:`` line per attempt in the job's log.  Its exit code is the last attempt's.
"""

import json
import os
import re
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


def decide(attempts, restarts, codes, killed=False, lost=None, replace_failed=False, what="stopped answering",
           block_end=False):
    """(start again?, why) after the last of ``attempts`` ({"code", "cause", "kind"} each) ended.

    Stops: on success (a job whose node was lost, e.g. after a spot notice, has not succeeded whatever
    its code); after `kill`; once the autostop watcher warned the job that its capacity block ends
    (``block_end``: the machines are about to go, a restart would only be cut off); when a node was
    lost and ``replace_failed`` is off (the job's nodes are fixed, so a restart would fail the same way:
    the user cordons or replaces the node); on an exit code not in ``codes``; when the N restarts are
    used up.  A lost node with ``replace_failed`` restarts once the node is replaced (whatever its
    code); a hang stopped by --hang-action kill restarts whatever ``codes`` says."""
    last = attempts[-1]
    code = last.get("code")
    if code == 0 and not lost:
        return False, "succeeded" + (f" on attempt {len(attempts)}" if len(attempts) > 1 else "")
    if killed:
        return False, "killed: no restart after `clustertool kill`"
    if block_end:
        return False, "the capacity block ends (the job was warned): no restart"
    used = len(attempts) - 1
    if lost and replace_failed:
        if used >= restarts:
            return False, f"{lost} lost and every restart used (--restarts {restarts}): giving up"
        return True, f"restart {used + 1} of {restarts} once {lost} is replaced"
    if lost:
        return False, (f"{lost} {what}: no restart without it (the job's nodes are fixed); "
                       f"`clustertool cordon {lost}` and run again on the others, or replace the node "
                       "(run --replace-failed does it for you)")
    if codes is not None and last.get("kind") != "hung" and code not in codes:
        wanted = ",".join(str(c) for c in codes)
        return False, f"exit code {code} is not in --restart-on-exit-codes {wanted}: no restart"
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
    if lost and lost.get("kind") == "spot":
        return f"{lost.get('node')} spot interruption", "spot", lost.get("node")
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
    """The supervisor and the spot-notice watcher (where the job has them), beside this attempt's mpirun."""
    return [subprocess.Popen([sys.executable, path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
            for path in (os.path.join(d, "supervise.py"), os.path.join(d, "spot.py")) if os.path.exists(path)]


def end_supervisor(sups):
    """They end by themselves once mpirun is gone; wait for them (a ``lost`` must be written)."""
    for sup in sups or []:
        try:
            sup.wait(SUPERVISOR_WAIT_S)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait()


def duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def await_replacement(d, state, path, lost, number, wait_s, replacer=None):
    """Until the recovery loop (``replacer``: the cluster's controller, else `clustertool recover` on the user's
    machine) says ``lost`` (names) are replaced: its ``replaced`` document, or (None, why the job stops: `kill`,
    or nobody replaced them within ``wait_s``)."""
    since = time.time()
    state["waiting"] = {"nodes": lost, "since": since, "until": since + wait_s, "attempt": number}
    if replacer:
        state["waiting"]["replacer"] = replacer
    write_json(path, state)
    who = replacer or ("`clustertool recover`, or `run --follow --replace-failed`, on the machine with the cloud "
                       "credentials")
    say(f"waiting up to {duration(wait_s)} for {', '.join(lost)} to be replaced ({who} does it)")
    marker = os.path.join(d, "replaced")
    try:
        while True:
            if os.path.exists(os.path.join(d, "killed")):
                return None, "killed while waiting for a replacement: no restart"
            doc = read_json(marker)
            if doc is not None and doc.get("attempt") == number:
                os.replace(marker, os.path.join(d, f"replaced.{number}"))
                return doc, None
            if time.time() > since + wait_s:
                return None, (f"{', '.join(lost)} not replaced within {duration(wait_s)} (--replace-wait): stopping; "
                              "`clustertool recover` replaces lost nodes while it runs")
            time.sleep(0.2)
    finally:
        state["waiting"] = None


def readdress(args, d, doc):
    """A replaced node with a new address (a new cloud machine): the address in the job's hostfile, its
    mpirun argv and its supervisors' arguments follows it; ``args["nodes"]`` too."""
    moves = {}
    for node in args.get("nodes") or []:
        new = (doc.get("nodes") or {}).get(node[0])
        if new and new[0] != node[1]:
            moves[node[1]] = new[0]
            node[1], node[2] = new[0], new[1]
    if not moves:
        return
    pattern = re.compile("|".join(r"(?<![0-9.])" + re.escape(old) + r"(?![0-9])" for old in moves))

    def sub(text):
        return pattern.sub(lambda m: moves[m.group(0)], text)

    args["argv"] = [sub(w) for w in args["argv"]]
    for name in ("hostfile", "supervise.py", "spot.py"):
        try:
            with open(os.path.join(d, name)) as fh:
                text = fh.read()
        except OSError:
            continue
        with open(os.path.join(d, name + ".tmp"), "w") as fh:
            fh.write(sub(text))
        os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))


def all_answer(nodes, wait_s=60.0):
    """None once every node takes a connection (a new node's sshd may still be starting), else the silent one."""
    deadline = time.monotonic() + wait_s
    while True:
        silent = silent_node(nodes)
        if silent is None or time.monotonic() > deadline:
            return silent
        time.sleep(0.5)


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
    sups = start_supervisor(d)
    while True:
        try:
            code = exit_code(proc.wait())
            break
        except InterruptedError:
            continue
    end_supervisor(sups)
    return code


def main(args):
    d, restarts, codes = args["job_dir"], int(args["restarts"]), args.get("codes")
    replace_failed, wait_s = bool(args.get("replace_failed")), float(args.get("replace_wait") or 600)
    state: dict = {"restarts": restarts, "codes": codes, "attempts": [], "verdict": None, "waiting": None}
    path = os.path.join(d, "attempts.json")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the tmux pane may close; the job goes on
    # started again on a new leader by the recovery loop (the old one was lost): its attempts so far
    state["attempts"] = [a for a in (read_json(path) or {}).get("attempts") or [] if isinstance(a, dict)]
    k = len(state["attempts"])
    while True:
        attempt: dict = {"attempt": k + 1, "restart_count": k, "start": time.time(), "end": None, "code": None,
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
        gone = lost_nodes(d, lost)
        attempt.update(end=time.time(), code=code, cause=None if code == 0 and not lost else cause, kind=kind)
        again, why = decide(state["attempts"], restarts, codes, os.path.exists(os.path.join(d, "killed")),
                            ", ".join(gone) or None, replace_failed,
                            "had a spot interruption notice" if kind == "spot" else "stopped answering",
                            os.path.exists(os.path.join(d, "blockend")))
        if again and gone and replace_failed:
            say(f"attempt {k + 1} ended: {cause}; {why}")
            doc, stop_why = await_replacement(d, state, path, gone, k + 1, wait_s, args.get("replacer"))
            if doc is None:
                again, why = False, stop_why
            else:
                readdress(args, d, doc)
                silent = all_answer(args.get("nodes") or [])
                attempt["replaced"] = {"nodes": gone, "at": time.time(), "by": doc.get("by")}
                if silent is not None:
                    again, why = False, f"{silent} does not answer after the replacement: no restart"
                else:
                    say(f"{', '.join(gone)} replaced; restarting")
        if not again:
            state["verdict"] = why
            write_json(path, state)
            if k > 0 or code != 0 or gone:
                say(f"attempt {k + 1} ended: {attempt['cause'] or 'exit code 0'}; {why}")
            return code or (1 if gone else 0)
        write_json(path, state)
        if not (gone and replace_failed):
            say(f"attempt {k + 1} ended: {cause}; {why}, same command, same job id")
        set_aside(d, k)
        k += 1


def lost_nodes(d, lost):
    """Every node the attempt lost (the supervisor may have found several at once), the first first."""
    if lost is None:
        return []
    doc = read_json(os.path.join(d, "lost")) or {}
    return [lost] + [n for n in doc.get("nodes") or [] if n != lost]


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    sys.exit(main(ARGS))  # noqa: F821
