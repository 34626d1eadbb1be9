"""Spot interruption notices, watched on the leader beside a job's mpirun (stdlib only).

AWS tells a spot instance two minutes ahead that it will be stopped or terminated: its instance
metadata (IMDSv2: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``, then
``GET /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token``) answers 404 until
then, and ``{"action": "terminate", "time": "..."}`` once the notice is out.  The metadata answers
only the instance itself, so this program, on the leader, starts a poller on every node of the job
(itself for the leader, over ssh for the others; one connection each for the job's life) that asks
its own metadata every ``interval`` seconds and prints one ``notice`` line when a notice comes.

On the first notice: it writes ``lost`` in the job's folder (that node, kind "spot": the restart loop
counts it as lost and, with --replace-failed, waits for its replacement), sends every rank of the job,
on every node, the signal the user chose (run --on-preempt-signal, default TERM) so the script can
checkpoint, and stops mpirun if the ranks have not ended ``grace`` seconds later (sooner where the notice's
time is nearer: the machine goes then).

``ARGS`` (prepended by the sender): ``job_dir``, ``job``, ``nodes`` ([name, address] of every node of the
job, leader first), ``url`` (the metadata's base URL; ``{node}`` in it becomes the node's name: only
tests point it elsewhere, at a stand-in), ``interval``, ``signal``, ``grace``.  What each node runs is
``poll`` of this same source, with its own ``url`` and ``interval``.  It ends with the job (mpirun's pid
gone); the pollers end when their stdin closes.
"""

import calendar
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

if "read_pid" not in globals():  # imported (tests); on a node the part comes first
    from clustertool.nodeprogs.procs import alive, read_pid

TOKEN_TTL_S = 21600
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5"]
# Every rank of the job on this node (ranks/<host>.<rank>: "pid ..." after the wrapper's exec), signaled.
SIGNAL_RANKS = r"""
d="$HOME/.clustertool/jobs/$1"
for f in "$d/ranks/$(uname -n)".*; do
  [ -f "$f" ] || continue
  read -r p _ < "$f"
  grep -q -a -z -x "CLUSTERTOOL_JOB=$1" "/proc/$p/environ" 2>/dev/null && kill "-$2" "$p" && echo "signaled $p"
done
true
"""


def token(base, timeout=2.0):
    req = urllib.request.Request(base + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode()


def instance_action(base, tok, timeout=2.0):
    """The notice ({"action", "time"}), or None while there is none (404)."""
    req = urllib.request.Request(base + "/latest/meta-data/spot/instance-action",
                                 headers={"X-aws-ec2-metadata-token": tok})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            doc = json.loads(resp.read().decode() or "{}")
            return doc if isinstance(doc, dict) else {"action": str(doc)}
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def stdin_closed(wait_s):
    """True once whoever started the poller went away (its ssh's stdin closes)."""
    ready, _, _ = select.select([sys.stdin], [], [], wait_s)
    return bool(ready) and not os.read(sys.stdin.fileno(), 4096)


def poll(args):
    """On a node: ask its metadata until a notice comes (print it) or stdin closes."""
    base, interval = args["url"].rstrip("/"), float(args.get("interval", 5.0))
    tok, got = None, 0.0
    while True:
        try:
            if tok is None or time.time() - got > TOKEN_TTL_S / 2:
                tok, got = token(base), time.time()
            doc = instance_action(base, tok)
            if doc is not None:
                sys.stdout.write("notice " + json.dumps(doc) + "\n")
                sys.stdout.flush()
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                tok = None  # the token expired
        except (OSError, ValueError):
            pass  # the metadata does not answer now: ask again next round
        if stdin_closed(interval):
            return


def say(d, line):
    with open(os.path.join(d, "log"), "a") as fh:
        fh.write(f"clustertool: {line}\n")


def poller_argv(node, leader, args):
    """The command that runs the poller for ``node`` (here for the leader, over ssh for another)."""
    poll_args = {"url": args["url"].replace("{node}", node[0]), "interval": args.get("interval", 5.0)}
    boot = "import json,sys;ARGS=json.loads(sys.argv[1]);exec(sys.stdin.buffer.readline().decode())"
    if node[0] == leader:
        return [sys.executable, "-c", boot, json.dumps(poll_args)]
    quoted = json.dumps(poll_args).replace("'", "'\\''")
    return SSH + [node[1], f"exec $(command -v python3 || command -v python) -c '{boot}' '{quoted}'"]


class Watch:
    """One poller per node; the first notice wins."""

    def __init__(self, args):
        self.args, self.d = args, args["job_dir"]
        self.leader = args["nodes"][0][0]
        self.notice = None
        self.lock = threading.Lock()
        self.procs = []
        with open(os.path.abspath(__file__)) as fh:
            source = fh.read()
        # the poller's own source, sent as one line of Python after which stdin stays open (its end: EOF)
        self.program = (f"g = {{'__name__': 'poller'}}; exec(compile({source!r}, 'spot', 'exec'), g); "
                        "g['poll'](ARGS)\n").encode()

    def start(self):
        for node in self.args["nodes"]:
            threading.Thread(target=self.one, args=(node,), daemon=True).start()

    def one(self, node):
        try:
            proc = subprocess.Popen(poller_argv(node, self.leader, self.args), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return
        self.procs.append(proc)
        pipe_in, pipe_out = proc.stdin, proc.stdout
        assert pipe_in is not None and pipe_out is not None
        try:
            pipe_in.write(self.program)
            pipe_in.flush()
        except OSError:
            return
        for line in pipe_out:
            text = line.decode("utf-8", "replace").strip()
            if text.startswith("notice "):
                with self.lock:
                    if self.notice is None:
                        self.notice = (node[0], json.loads(text[7:]))
                return

    def close(self):
        for proc in self.procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def signal_ranks(args, sig):
    """Send every rank of the job, on every node, ``sig``; the pids signaled per node."""
    job, leader = args["job"], args["nodes"][0][0]
    done = {}

    def one(node):
        argv = ["sh", "-s", job, sig] if node[0] == leader else SSH + [node[1], f"sh -s {job} {sig}"]
        try:
            out = subprocess.run(argv, input=SIGNAL_RANKS.encode(), stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, timeout=20).stdout.decode()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        done[node[0]] = [int(w) for line in out.splitlines() for w in line.split()[1:] if w.isdigit()]

    threads = [threading.Thread(target=one, args=(n,)) for n in args["nodes"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    return done


def stop(pid, grace):
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(pid):
            return
        try:
            os.kill(pid, sig)
        except OSError:
            return
        end = time.monotonic() + 5
        while time.monotonic() < end and alive(pid):
            time.sleep(0.1)


def act(args, pid, node, doc):
    """A notice for ``node``: it counts as lost; every rank gets the signal; mpirun ends within the grace."""
    d, sig = args["job_dir"], str(args.get("signal") or "TERM")
    lost = {"node": node, "time": time.time(), "what": "spot interruption notice", "kind": "spot",
            "action": doc.get("action"), "at": doc.get("time"), "nodes": [node]}
    if not os.path.exists(os.path.join(d, "lost")):
        tmp = os.path.join(d, "lost.tmp")
        with open(tmp, "w") as fh:
            json.dump(lost, fh)
        os.replace(tmp, os.path.join(d, "lost"))
    say(d, f"{node}: spot interruption notice ({doc.get('action') or '?'} at {doc.get('time') or '?'}); "
           f"sending SIG{sig} to every rank, {node} counts as lost")
    done = signal_ranks(args, sig)
    grace = grace_s(doc.get("time"), float(args.get("grace", 30.0)))
    say(d, f"SIG{sig} sent to {sum(len(v) for v in done.values())} rank(s); the job stops within {grace:.0f}s")
    stop(pid, grace)


def grace_s(when, most):
    """How long the ranks get after the signal: ``most``, and never past 10 s before the announced time
    (ISO 8601, UTC), yet at least 2 s (the signal handlers run)."""
    try:
        left = calendar.timegm(time.strptime(str(when), "%Y-%m-%dT%H:%M:%SZ")) - time.time()
    except ValueError:
        return most
    return max(2.0, min(most, left - 10.0))


def main(args):
    d = args["job_dir"]
    pid = read_pid(os.path.join(d, "mpirun.pid"))
    if pid is None:
        return
    watch = Watch(args)
    watch.start()
    try:
        while alive(pid) and not os.path.exists(os.path.join(d, "exit.tmp")):
            if watch.notice is not None:
                act(args, pid, *watch.notice)
                return
            time.sleep(0.2)
    finally:
        watch.close()


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    main(ARGS)  # noqa: F821
