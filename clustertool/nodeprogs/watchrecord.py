"""The watch hub's daemon side and its entry point (stdlib only; the last part of ``watchhub``).

``serve`` (the exporter that `monitoring enable` starts on the leader) and ``record`` (one job's
record, for launchers that start it beside the job) keep each running job's record in its folder;
``once`` and ``stream`` are watchhub.py's.  A record is written by one process at a time: each takes
``watch/record.lock`` (flock) first, and one that cannot leaves the job to whoever holds it.
"""

import fcntl
import http.server
import json
import os
import signal
import threading
import time

if "Hub" not in globals():  # imported (tests); on the leader the parts come first
    from clustertool.nodeprogs.watchcore import metrics_text, record_line
    from clustertool.nodeprogs.watchhub import JOBS, RECORD_MAX, Hub, name_process, run_once, run_stream, running_jobs


class Record:
    """One job's samples.jsonl: a header, then a line per kept reading; thinned past RECORD_MAX bytes."""

    def __init__(self, job, nodes, interval, jobs_dir=None, limit=None):
        self.id, self.stride, self.count = job["id"], 1, 0
        self.lock: int | None = None
        self.limit = limit or RECORD_MAX
        self.dir = os.path.join(jobs_dir or JOBS, job["id"], "watch")
        self.path = os.path.join(self.dir, "samples.jsonl")
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(os.path.join(self.dir, "record.lock"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self.lock = fd
        if not os.path.exists(self.path):
            header = {"header": {"job": job["id"], "name": job.get("name"), "job_nodes": job.get("nodes"),
                                 "nodes": [[n, r] for n, _, r in nodes], "interval": interval, "since": time.time()}}
            self.append(header)

    @property
    def held(self):
        return self.lock is not None

    def append(self, doc):
        with open(self.path, "a") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def add(self, view):
        self.count += 1
        if not self.held or self.count % self.stride:
            return
        self.append(record_line(view, self.id))
        if os.path.getsize(self.path) > self.limit:
            self.thin()

    def thin(self):
        with open(self.path) as fh:
            lines = fh.readlines()
        heads = [line for line in lines if line.startswith('{"header"')]
        rest = [line for line in lines if not line.startswith('{"header"')]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.writelines(heads[:1] + rest[::2])
        os.replace(tmp, self.path)
        self.stride *= 2

    def close(self):
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


class Metrics(http.server.BaseHTTPRequestHandler):
    latest = "# no reading yet\n"

    def do_GET(self):  # noqa: N802  (http.server's name)
        wanted = self.path.split("?")[0] == "/metrics"
        body = (Metrics.latest if wanted else "clustertool exporter: /metrics\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def cost_now(cost):
    if not cost or cost.get("hourly") is None:
        return None
    hours = max(0.0, time.time() - cost["since"]) / 3600.0
    return {"hourly": cost["hourly"], "so_far": cost.get("spent", 0.0) + cost["hourly"] * hours}


def serve(hub, args):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(args.get("port", 9105))), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    records: dict = {}
    try:
        due = time.monotonic()
        while True:
            jobs = running_jobs()
            view = hub.reading(jobs, wait_s=min(hub.interval * 0.8, 5.0))
            Metrics.latest = metrics_text(view, cost_now(args.get("cost")))
            keep(records, jobs, hub, view)
            due += hub.interval
            time.sleep(max(0.0, due - time.monotonic()))
    finally:
        server.shutdown()
        for rec in records.values():
            rec.close()


def keep(records, jobs, hub, view):
    """Add the reading to every running job's record; close those of jobs that ended."""
    ids = {j["id"] for j in jobs}
    for job_id in [k for k in records if k not in ids]:
        records.pop(job_id).close()
    for job in jobs:
        if job["id"] not in records:
            records[job["id"]] = Record(job, hub.state["nodes"], hub.interval)
        records[job["id"]].add(view)


def record(hub, args):
    """One job's record (the recorder started with the job): a reading every interval until the job ends, looked
    for every half second so the recorder goes soon after the job.  The first reading waits for every sampler's
    first answer (up to ``connect_s``, as ``once`` does): a sampler slow to start on a loaded node must not leave
    the record's first lines without it."""
    wanted = [args["job"]]
    jobs = running_jobs(wanted)
    if not jobs:
        return
    rec = Record(jobs[0], hub.state["nodes"], hub.interval)
    if not rec.held:
        return  # another recorder keeps it
    try:
        due, wait_s = None, float(args.get("connect_s", 10.0))   # the first reading once every sampler answered
        while jobs:
            rec.add(hub.reading(jobs, wait_s=wait_s))
            due, wait_s = (due or time.monotonic()) + hub.interval, min(hub.interval * 0.8, 5.0)
            while jobs and time.monotonic() < due:
                time.sleep(max(0.0, min(0.5, due - time.monotonic())))
                jobs = running_jobs(wanted)
    finally:
        rec.close()


def _stop(*_):
    raise KeyboardInterrupt


def main(args):
    name_process("ct-watch")
    signal.signal(signal.SIGTERM, _stop)
    hub = Hub(args)
    hub.start()
    try:
        {"once": run_once, "stream": run_stream, "serve": serve, "record": record}[args["mode"]](hub, args)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        hub.close()


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "mode" in ARGS:  # noqa: F821  (prepended)
    main(ARGS)  # noqa: F821
