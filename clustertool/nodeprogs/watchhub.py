"""The watch hub on the leader (stdlib only): one sampler per node, their answers made into views.

``clustertool top`` starts it over one ssh session to the leader; ``monitoring enable`` starts it as a
daemon there (``serve``).  It starts watchnode.py on every node: itself for the leader, over the
cluster's own ssh (the leader's keys and known_hosts, as mpirun uses) for the others, one connection
per node for as long as it runs, never one per reading.  Every ``interval`` it asks each sampler
for a reading (a line on its stdin), waits for the answers (a node that does not answer in time
shows its last reading, then stale), and makes a view (watchcore.build_view).

Modes (``ARGS["mode"]``):

* ``stream``: a view per reading on stdout, one JSON line each, until stdin closes (top has quit).
* ``once``: a first reading once every sampler answered (not counted: its rates span each sampler's start),
  then ``samples`` readings ``interval`` apart; prints the last view, exits.
* ``serve``: a daemon: the latest metrics in Prometheus's text format at ``http://127.0.0.1:PORT/metrics``
  (the leader's own loopback: Prometheus beside it scrapes it; nothing listens beyond the node), and
  a record of every running job (below).  Ends on SIGTERM.
* ``record``: the record of one job (``job``), until the job ends.

A job's record: ``~/.clustertool/jobs/<id>/watch/samples.jsonl``, a header line then one line per
reading (watchcore.record_line); past RECORD_MAX bytes every other line is dropped and readings
are kept half as often, so a long job's record stays bounded.

Running jobs are the leader's job folders with job.json whose launch.sh still runs (as the autostop
watcher sees them).  Cordoned nodes: those the control machine named, and workers missing from the
leader's ``~/hostfile`` (cordon writes it again).
"""

import json
import os
import subprocess
import sys
import threading
import time

if "build_view" not in globals():  # imported (tests); on the leader the part comes first
    from clustertool.nodeprogs.watchcore import Streaks, build_view

HOME = os.path.expanduser("~")
JOBS = os.path.join(HOME, ".clustertool", "jobs")
JOB_ENV = "CLUSTERTOOL_JOB"
PENDING_S = 30.0
RETRY_S = 15.0
RECORD_MAX = 32 << 20
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5",
       "-o", "ServerAliveCountMax=2"]


def name_process(name):
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class Member:
    """One node's sampler: its process (ssh, or a local python), its latest answer."""

    def __init__(self, node, hub):
        self.name, self.address, self.role = node
        self.hub, self.proc, self.started = hub, None, 0.0
        self.sample, self.seen, self.state, self.error, self.last_seq = None, None, "starting", None, None
        self.lock = threading.Lock()

    def argv(self):
        command = self.hub.args["remote_python"]
        if self.name == self.hub.args["leader"]:
            return ["sh", "-c", command]
        return SSH + [self.address, command]

    def start(self):
        self.started = time.monotonic()
        args = {"node": self.name, "regex": self.hub.args.get("regex") or [], "gpu": self.hub.args.get("gpu", True),
                "gpu_ms": int(1000 * min(self.hub.interval, 5.0))}
        text = ("import json\nARGS = json.loads(%s)\n" % json.dumps(json.dumps(args)) + self.hub.args["node_source"])
        data = text.encode()
        try:
            self.proc = proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self.state, self.error = "unreachable", str(exc)
            return
        try:
            assert proc.stdin is not None  # spawned with pipes
            proc.stdin.write(b"%d\n" % len(data) + data)
            proc.stdin.flush()
        except OSError:  # ssh has ended already (a refused connection): its reader below says why, in ssh's words
            pass
        threading.Thread(target=self.read, args=(self.proc,), daemon=True).start()

    def read(self, proc):
        for raw in proc.stdout:
            try:
                sample = json.loads(raw)
            except ValueError:
                continue
            with self.lock:
                self.sample, self.seen, self.state, self.last_seq = sample, time.monotonic(), "ok", sample.get("seq")
            self.hub.answered.set()
        err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
        proc.wait()
        with self.lock:
            self.state = "unreachable"
            self.error = (err[-1][:200] if err else f"sampler exited {proc.returncode}")
        self.hub.answered.set()

    def ask(self, request):
        if self.proc is None or self.proc.poll() is not None:
            if time.monotonic() - self.started > RETRY_S:
                self.start()
            return
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self):
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- the leader's jobs -----------------------------------------------------------------------

def read_json(path, default=None):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def job_alive(d, name, now):
    if os.path.exists(os.path.join(d, "exit")):
        return False
    try:
        with open(os.path.join(d, "launch.pid")) as fh:
            pid = fh.read().split()[0]
    except (OSError, IndexError):
        try:
            return now - os.path.getmtime(os.path.join(d, "job.json")) < PENDING_S
        except OSError:
            return False
    try:
        with open("/proc/%s/environ" % pid, "rb") as fh:
            return ("%s=%s" % (JOB_ENV, name)).encode() in fh.read().split(b"\0")
    except OSError:
        return False


def running_jobs(wanted=None, jobs_dir=JOBS, now=None):
    """[{id, name, nodes, out, started}] of the running jobs (``wanted``: only those ids)."""
    now = time.time() if now is None else now
    found = []
    for name in sorted(os.listdir(jobs_dir)) if os.path.isdir(jobs_dir) else []:
        d = os.path.join(jobs_dir, name)
        if (wanted and name not in wanted) or not job_alive(d, name, now):
            continue
        record = read_json(os.path.join(d, "job.json"), {}) or {}
        found.append({"id": name, "name": record.get("name"), "nodes": record.get("nodes") or [],
                      "out": record.get("output_dir") or os.path.join(d, "out"), "started": record.get("started")})
    return found


def cordoned(args):
    """The nodes the control machine named, and workers missing from the leader's hostfile."""
    out = set(args.get("cordoned") or [])
    try:
        with open(os.path.join(HOME, "hostfile")) as fh:
            listed = {line.split()[0].split(":")[0] for line in fh if line.strip() and not line.startswith("#")}
    except OSError:
        return out
    return out | {n for n, addr, role in args["nodes"] if role != "server" and listed and addr not in listed}


# ---- the hub ---------------------------------------------------------------------------------

class Hub:
    def __init__(self, args):
        self.args, self.interval = args, float(args.get("interval") or 1.0)
        self.members = [Member(tuple(n), self) for n in args["nodes"]]
        self.answered, self.seq = threading.Event(), 0
        self.state = {"nodes": [tuple(n) for n in args["nodes"]], "leader": args["leader"], "cordoned": set(),
                      "link_bps": args.get("link_bps"), "interval": self.interval, "streaks": Streaks()}

    def start(self):
        self.started, self.connected_s = time.monotonic(), None
        for m in self.members:
            m.start()

    def answering(self):
        """The members that answered the latest reading."""
        return [m for m in self.members if m.last_seq == self.seq]

    def reading(self, jobs, wait_s, expect=None):
        """Ask every sampler; wait until each of ``expect`` (default: all) answered or ``wait_s``; the view."""
        self.seq += 1
        request = {"seq": self.seq, "jobs": [{"id": j["id"], "out": j["out"]} for j in jobs]}
        waiting = self.members if expect is None else expect
        asked = time.monotonic()
        for m in self.members:
            m.ask(request)
        deadline = asked + wait_s
        while time.monotonic() < deadline:
            if all(m.last_seq == self.seq or m.state == "unreachable" for m in waiting):
                break
            self.answered.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            self.answered.clear()
        samples = {}
        for m in self.members:
            with m.lock:
                samples[m.name] = (m.sample, m.seen, m.state, m.error)
        self.state["cordoned"] = cordoned(self.args)
        view = build_view(self.state, samples, jobs, time.time(), time.monotonic())
        view["hub_cpu_s"] = round(sum(os.times()[:4]), 3)
        view["reading_s"] = round(time.monotonic() - asked, 3)  # asking every node to having the view
        view["answered"] = sum(1 for m in self.members if m.last_seq == self.seq)
        if self.connected_s is None and view["answered"] == len(self.members):
            self.connected_s = round(time.monotonic() - self.started, 3)
        view["connected_s"] = self.connected_s  # from the hub's start to every sampler's first answer
        return view

    def close(self):
        threads = [threading.Thread(target=m.close) for m in self.members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)


def emit(view):
    sys.stdout.write(json.dumps(view, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def stdin_watch(stop):
    """Set ``stop`` when stdin closes (the one who asked has gone)."""
    def run():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()
    threading.Thread(target=run, daemon=True).start()


def run_once(hub, args):
    """A first reading once every sampler answered (not counted: its rates span each sampler's start), then
    ``samples`` readings ``interval`` apart; prints the last.

    Each reading waits for the answer of every sampler that answered the one before (up to ``connect_s``), not
    for an interval: on a loaded machine an answer may take longer than ``interval``, and the view printed
    must hold every answering node's reading of that moment (and no request may queue behind a late one,
    which would make its rates span nothing).  A node that stopped answering is waited for once, then shown
    stale; one that never answered is not waited for again."""
    wanted, connect_s = args.get("jobs"), float(args.get("connect_s", 10.0))
    view = hub.reading(running_jobs(wanted), wait_s=connect_s)
    for _ in range(int(args.get("samples", 3))):
        time.sleep(hub.interval)
        view = hub.reading(running_jobs(wanted), wait_s=connect_s, expect=hub.answering())
    emit(view)


def run_stream(hub, args):
    stop = threading.Event()
    stdin_watch(stop)
    wanted = args.get("jobs")
    emit(hub.reading(running_jobs(wanted), wait_s=min(hub.interval, 2.0)))
    due = time.monotonic() + hub.interval
    while not stop.wait(max(0.0, due - time.monotonic())):
        due += hub.interval
        emit(hub.reading(running_jobs(wanted), wait_s=hub.interval * 0.8))


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)
