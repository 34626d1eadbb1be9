"""The spot-notice watcher (nodeprogs/spot.py) on this machine as a one-node job's leader.

The EC2 instance metadata is a stand-in here (an HTTP server of this test that speaks IMDSv2: a
token from PUT /latest/api/token, then GET /latest/meta-data/spot/instance-action with it, 404 until
the test announces a notice).  The job's "rank" is a real process carrying the job's marker, recorded
in ranks/ as the rank wrapper records it; "mpirun" is a process the watcher must stop after the grace.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clustertool import nodeprogs
from clustertool.core.errors import UsageError
from clustertool.jobs import recovery
from clustertool.jobs.jobrequests import RunRequest


class Metadata(BaseHTTPRequestHandler):
    """Stand-in for the instance metadata: IMDSv2 only (a GET without the token is refused)."""

    notice: dict | None = None
    seen: list = []

    def log_message(self, *args):
        pass

    def do_PUT(self):
        self.seen.append(("PUT", self.path, self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")))
        self._reply(200, "tok")

    def do_GET(self):
        self.seen.append(("GET", self.path, self.headers.get("X-aws-ec2-metadata-token")))
        if self.headers.get("X-aws-ec2-metadata-token") != "tok":
            self.send_error(401)
        elif self.path == "/latest/meta-data/spot/instance-action" and self.notice:
            self._reply(200, json.dumps(self.notice))
        else:
            self.send_error(404)

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def metadata():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Metadata.notice, Metadata.seen = None, []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wait(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_notice_signals_the_ranks_marks_the_node_lost_and_stops_mpirun(tmp_path, metadata):
    job = "j1126-abc123"
    d = tmp_path / ".clustertool" / "jobs" / job
    (d / "ranks").mkdir(parents=True)
    (d / "log").write_text("")
    mark = tmp_path / "got"
    env = dict(os.environ, HOME=str(tmp_path), CLUSTERTOOL_JOB=job)
    rank = subprocess.Popen(["sh", "-c", f'trap "echo USR1 > {mark}; exit 0" USR1; while :; do sleep 0.1; done'],
                            env=env)
    mpirun = subprocess.Popen(["sleep", "60"])
    try:
        (d / "ranks" / f"{os.uname().nodename}.0").write_text(f"{rank.pid} 1 1 1\n")
        (d / "mpirun.pid").write_text(f"{mpirun.pid}\n")
        program = nodeprogs.program_text("spot", {"job_dir": str(d), "job": job, "nodes": [["node-1", "127.0.0.1"]],
                                                  "url": metadata, "interval": 0.2, "signal": "USR1", "grace": 1.0})
        (d / "spot.py").write_bytes(program)
        watcher = subprocess.Popen([sys.executable, str(d / "spot.py")], env=env)
        _wait(lambda: any(m == "GET" for m, _, _ in Metadata.seen))
        assert not (d / "lost").exists() and watcher.poll() is None  # 404: no notice, nothing done
        Metadata.notice = {"action": "terminate", "time": "2026-11-26T18:00:00Z"}
        assert watcher.wait(30) == 0
        assert mark.read_text().strip() == "USR1"  # the rank got the signal the user chose
        lost = json.loads((d / "lost").read_text())
        assert (lost["node"], lost["kind"], lost["action"]) == ("node-1", "spot", "terminate")
        log = (d / "log").read_text()
        assert "node-1: spot interruption notice (terminate at 2026-11-26T18:00:00Z); sending SIGUSR1" in log
        assert mpirun.wait(10) == -signal.SIGTERM  # the ranks' grace passed: mpirun is stopped
        assert Metadata.seen[0][0] == "PUT" and Metadata.seen[0][2]  # IMDSv2: a token first, with its TTL
        assert all(t == "tok" for m, _, t in Metadata.seen if m == "GET")
    finally:
        for p in (rank, mpirun):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_poller_asks_again_while_the_metadata_does_not_answer_and_ends_when_its_stdin_closes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    source = nodeprogs.program_text("spot", {"url": f"http://127.0.0.1:{port}", "interval": 0.1})
    proc = subprocess.Popen([sys.executable, "-c", "import sys; exec(sys.stdin.readline())"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = (f"g = {{'__name__': 'x'}}; exec(compile({source.decode()!r}, 's', 'exec'), g); g['poll'](g['ARGS'])\n")
    proc.stdin.write(line.encode())
    proc.stdin.flush()
    time.sleep(0.5)
    assert proc.poll() is None  # no answer: it keeps asking
    proc.stdin.close()
    assert proc.wait(10) == 0 and proc.stdout.read() == b""


def options(restarts: int, replace_failed: bool, replace_wait: float | None, signal: str | None) -> RunRequest:
    return RunRequest.of("x", restarts=restarts, replace_failed=replace_failed, replace_wait=replace_wait,
                         on_preempt_signal=signal)


def test_recovery_options_are_checked_and_one_clear_line():
    asked = options(2, True, None, "sigusr1").recovery
    assert (asked.replace_failed, asked.wait_s, asked.on_preempt_signal) == (True, 600.0, "USR1")
    assert options(0, False, None, None).recovery.wait_s is None
    for args, words in [((0, True, None, None), "goes with --restarts"), ((1, False, 60.0, None), "goes with"),
                        ((1, True, 2.0, None), "too short"), ((1, True, None, "KILLME"), "--on-preempt-signal")]:
        with pytest.raises(UsageError, match=words):
            options(*args)


def test_the_ranks_get_the_grace_but_never_past_ten_seconds_before_the_machine_goes():
    from clustertool.nodeprogs import spot

    def at(seconds):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))

    assert spot.grace_s(None, 30.0) == 30.0 and spot.grace_s("soon", 30.0) == 30.0
    assert spot.grace_s(at(120), 30.0) == 30.0  # AWS's two minutes: the whole grace
    assert 14.0 <= spot.grace_s(at(25), 30.0) <= 15.0
    assert spot.grace_s(at(3), 30.0) == 2.0  # at least long enough for the handlers to run


def test_notices_are_watched_on_spot_clusters_and_a_signal_for_another_cluster_is_refused(monkeypatch):
    from clustertool.core.model import ClusterRecord

    monkeypatch.delenv(recovery.IMDS_ENV, raising=False)
    spot = ClusterRecord(name="s", provider="aws", options={"spot": True})
    plain = ClusterRecord(name="p", provider="aws", options={})
    policy = options(1, True, None, None).recovery
    assert recovery.preempt_signal(spot, policy) == "TERM"  # the default signal
    assert recovery.preempt_signal(plain, policy) is None  # nothing watches
    with pytest.raises(UsageError, match="not made of spot instances"):
        recovery.preempt_signal(plain, options(1, True, None, "USR1").recovery)
    monkeypatch.setenv(recovery.IMDS_ENV, "http://127.0.0.1:9/{node}")  # a test's stand-in: watched anywhere
    assert recovery.preempt_signal(plain, options(1, True, None, "USR1").recovery) == "USR1"
