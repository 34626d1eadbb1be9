"""The job supervisor, beside mpirun on the leader (stdlib only; never imports clustertool).

mpirun already stops the whole job when a rank (or a node's launcher) exits non-zero or is killed.
What it does not see in time is a node that stops answering: a crashed or cut-off machine leaves
the other ranks waiting in a collective until the backend's own timeout.  This program asks every
other node of the job, every ``interval`` seconds, whether its ssh port still takes a connection;
when one has not for ``misses`` rounds in a row, it writes ``lost`` in the job's folder (which node,
since when) and stops mpirun (TERM, then KILL after ``grace`` seconds), whose daemons on the nodes
that still answer then stop their ranks.

With ``hang_timeout``, it also asks every node of the job (the leader itself, the others over ssh,
as mpirun reaches them) how many bytes the job's ranks have written there and how much CPU time they
have used.  When no output moved anywhere, nor CPU beyond QUIET_CPU of a core per rank, for that long,
it saves every node's stacks (the stacks node program, ``hangstacks.py``) in ``hang/<node>``, writes
``hung`` (since when), says so in the log, and with ``hang_action`` "kill" stops the job as for a lost
node.  Output or CPU that moves again clears ``hung``.

``ARGS`` (prepended by the sender): ``job_dir``, ``nodes`` ([name, address, port] of the other
nodes), ``interval``, ``misses``, ``grace``; ``hang_timeout`` (seconds, or null), ``hang_action``,
``all_nodes`` ([name, address] of every node of the job, leader first).  It ends with the job
(mpirun's pid gone).
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time

if "read_pid" not in globals():  # imported (tests); on a node the part comes first
    from clustertool.nodeprogs.procs import alive, read_pid

# One node's progress: bytes the job's ranks wrote there, and their CPU time (clock ticks).
PROBE = r"""
d="$HOME/.clustertool/jobs/$1"; b=0; c=0
for f in "$d"/out/*/rank.*/std* "$d"/out/attempt.*/*/rank.*/std*; do [ -f "$f" ] && b=$((b + $(stat -c %s "$f"))); done
n=0
for r in "$d/ranks/$(uname -n)".*; do
  [ -f "$r" ] || continue
  read -r p _ < "$r"
  t=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}')
  c=$((c + ${t:-0})); n=$((n + 1))
done
echo "progress $b $c $n"
"""
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]

def answers(address, port, timeout):
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def at_once(nodes, work, timeout, missing=None):
    """{name: work(node)} for every node, all at once (``missing`` for one that took longer than ``timeout``)."""
    result = {}

    def one(node):
        result[node[0]] = work(node)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return {n[0]: result.get(n[0], missing) for n in nodes}


def probe_all(nodes, timeout):
    """{name: answered} for every node, probed at once."""
    return at_once(nodes, lambda n: answers(n[1], int(n[2]), timeout), timeout, missing=False)


def stop(pid, grace):
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def stragglers(job_id):
    """This job's ssh clients left on the leader (mpirun's, to the lost node: they wait on a dead link)."""
    marker = f"CLUSTERTOOL_JOB={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                if fh.read().strip() != "ssh":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def on_node(node, leader, argv, stdin, timeout):
    """Run ``argv`` (stdin: text) here for the leader, over ssh for another node: its stdout, or None."""
    cmd = argv if node[0] == leader else SSH + [node[1], " ".join(argv)]
    try:
        out = subprocess.run(cmd, input=stdin.encode(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def on_all(nodes, leader, argv, stdin, timeout):
    return at_once(nodes, lambda n: on_node(n, leader, argv, stdin, timeout), timeout)


# A rank waiting in a collective is not idle to the clock tick: its backend's threads wake now and then (gloo's,
# NCCL's watchdog), and on a loaded machine each wake costs more.  Under this share of a core per rank, averaged
# since the last change, its CPU time is no progress; a rank that works uses most of a core.
QUIET_CPU = 0.01


class HangWatch:
    """No rank wrote a byte, and no rank used more than QUIET_CPU of a core, on any node for ``timeout`` seconds."""

    def __init__(self, args):
        self.d, self.timeout = args["job_dir"], float(args["hang_timeout"])
        self.action = args.get("hang_action", "keep")
        self.nodes = args["all_nodes"]
        self.leader = self.nodes[0][0]
        self.poll = max(1.0, min(5.0, self.timeout / 4))
        self.next = 0.0
        self.last = None
        self.changed = time.time()
        self.reported = False

    def progress(self):
        job = os.path.basename(self.d.rstrip("/"))
        said = on_all(self.nodes, self.leader, ["sh", "-s", job], PROBE.replace("$1", job), 15.0)
        silent = sorted(k for k, v in said.items() if v is None or "progress " not in v)
        if silent:
            self.note(f"no answer from {', '.join(silent)}")
            return None  # a node did not answer: no verdict this round (a lost node is the other check's)
        counts = [v.split("progress ", 1)[1].split() for v in said.values()]
        # per node: bytes written there (a node's own figure: one that shrinks or grows is output), CPU, ranks
        return (tuple(sorted((k, c[0]) for k, c in zip(said, counts))), sum(int(c[1]) for c in counts),
                sum(int(c[2]) for c in counts if len(c) > 2))

    def moved(self, seen):
        """Output anywhere, or CPU above QUIET_CPU a rank since the last change."""
        if self.last is None or seen[0] != self.last[0]:
            self.note("output" if self.last else "first look")
            return True
        cpu_s = (seen[1] - self.last[1]) / os.sysconf("SC_CLK_TCK")
        limit_s = QUIET_CPU * max(1, seen[2]) * max(self.poll, time.time() - self.changed)
        self.note(f"ranks used {cpu_s:.2f}s of CPU (quiet under {limit_s:.2f}s)")
        return cpu_s > limit_s

    def note(self, why):
        """What the last look saw, in ``hangwatch`` beside the job's record (read when a hang was not found)."""
        try:
            write_json(os.path.join(self.d, "hangwatch"), {"time": time.time(), "since": self.changed,
                                                           "timeout": self.timeout, "saw": why})
        except OSError:
            pass

    def check(self):
        """True when the job is to be stopped (hung, and the action is kill)."""
        now = time.monotonic()
        if now < self.next:
            return False
        self.next = now + self.poll
        seen = self.progress()
        if seen is None:
            return False
        if self.moved(seen):
            self.last, self.changed = seen, time.time()
            if self.reported:
                self.reported = False
                remove(os.path.join(self.d, "hung"))
            return False
        if self.reported or time.time() - self.changed < self.timeout:
            return False
        self.reported = True
        self.save_stacks()
        time.sleep(0.5)  # the ranks' Flight Recorder dumps (asked by the stacks program) used CPU: not progress
        self.last = self.progress() or self.last
        write_json(os.path.join(self.d, "hung"), {"since": self.changed, "detected": time.time(),
                                                  "timeout": self.timeout, "action": self.action})
        say(self.d, f"no rank wrote a line or used over {QUIET_CPU:.0%} of a core for {self.timeout:g}s: hung? "
                    "(stacks saved; "
                    + ("stopping the job" if self.action == "kill" else "the job keeps running") + ")")
        if self.action == "kill":
            write_json(os.path.join(self.d, "lost"), {"node": None, "time": self.changed, "what": "hung",
                                                      "kind": "hung"})
            return True
        return False

    def save_stacks(self):
        try:
            with open(os.path.join(self.d, "hangstacks.py")) as fh:
                program = fh.read()
        except OSError:
            return
        os.makedirs(os.path.join(self.d, "hang"), exist_ok=True)
        said = on_all(self.nodes, self.leader, ["python3", "-"], program, 60.0)
        for name, out in said.items():
            if out is not None:
                write_text(os.path.join(self.d, "hang", name), out)


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_json(path, doc):
    write_text(path, json.dumps(doc))


def say(d, line):
    with open(os.path.join(d, "log"), "a") as fh:
        fh.write(f"clustertool: {line}\n")


def running(pid, d):
    return alive(pid) and not os.path.exists(os.path.join(d, "exit.tmp"))


def watch_hang(watch, pid, d, grace):
    while running(pid, d):
        try:
            hung = watch.check()
        except Exception as exc:  # noqa: BLE001  (one bad look must not end the watch: the next one may be fine)
            watch.note(f"the look failed: {type(exc).__name__}: {exc}")
            hung = False
        if hung:
            stop(pid, grace)
            return
        time.sleep(0.5)


def main(args):
    d = args["job_dir"]
    pid = read_pid(os.path.join(d, "mpirun.pid"))
    if pid is None or not (args["nodes"] or args.get("hang_timeout")):
        return
    if args.get("hang_timeout"):  # its own thread: a slow node's answer never delays the lost-node check
        threading.Thread(target=watch_hang, args=(HangWatch(args), pid, d, float(args.get("grace", 5.0))),
                         daemon=True).start()
    interval, misses = float(args.get("interval", 2.0)), int(args.get("misses", 3))
    missed: dict = {}
    since: dict = {}
    while running(pid, d):
        started = time.monotonic()
        for name, ok in probe_all(args["nodes"], interval).items():
            if ok:
                missed.pop(name, None)
                since.pop(name, None)
                continue
            missed[name] = missed.get(name, 0) + 1
            since.setdefault(name, time.time())
        gone = [n for n, count in missed.items() if count >= misses]
        if gone:
            first = min(gone, key=lambda n: since[n])
            write_json(os.path.join(d, "lost"), {"node": first, "time": since[first], "what": "stopped answering",
                                                 "nodes": sorted(gone)})
            say(d, f"{first} stopped answering (no ssh connection for {misses} rounds of {interval:g}s); "
                   "stopping the job")
            stop(pid, float(args.get("grace", 5.0)))
            for straggler in stragglers(os.path.basename(d.rstrip("/"))):
                try:
                    os.kill(straggler, signal.SIGKILL)
                except OSError:
                    pass
            return
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    main(ARGS)  # noqa: F821
