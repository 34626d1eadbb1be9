"""The watch hub as a real process on this machine: the leader's sampler beside it, a member that ssh cannot
reach (nothing listens on 127.0.0.2:22 here), and what `top --once` then says about each."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys

import pytest

from clustertool import nodeprogs

pytestmark = pytest.mark.unit


def nothing_listens(addr: str, port: int = 22) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((addr, port)) != 0


def test_once_reports_the_leader_and_names_the_unreachable_member(tmp_path):
    if not nothing_listens("127.0.0.2"):
        pytest.skip("something listens on 127.0.0.2:22 here")
    args = {"mode": "once", "leader": "n1", "nodes": [["n1", "127.0.0.1", "leader"], ["n2", "127.0.0.2", "member"]],
            "node_source": nodeprogs.program_source("watchnode"), "remote_python": nodeprogs.stream_command(),
            "interval": 0.3, "samples": 2, "regex": [], "jobs": None, "gpu": False, "connect_s": 5}
    done = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("watchhub", args), capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    view = json.loads(done.stdout)
    nodes = {n["name"]: n for n in view["nodes"]}
    assert nodes["n1"]["state"] == "ok" and nodes["n1"]["cpu"] is not None and nodes["n1"]["gpus"] is None
    assert nodes["n2"]["state"] == "unreachable" and "refused" in (nodes["n2"]["error"] or "").lower()
    assert view["answered"] == 1 and view["jobs"] == []


# A stand-in for a loaded machine: the real sampler, each of its answers held back DELAY_S (twice the interval).
DELAY_S = 0.6
LATE_ANSWERS = ("import sys, time\nfor line in iter(sys.stdin.buffer.readline, b''):\n"
                "    time.sleep(%s)\n    sys.stdout.buffer.write(line)\n    sys.stdout.buffer.flush()\n" % DELAY_S)


def test_once_waits_for_a_sampler_slower_than_the_interval():
    """`top --once` on a loaded machine: the leader's sampler answers each reading after twice the interval.  The
    view printed holds its answer to the last reading (rates over an interval, CPU known), not an older answer of
    a reading that timed out at one interval (the race that made the test above fail now and then under load)."""
    late = f"{nodeprogs.stream_command()} | {sys.executable} -u -c {shlex.quote(LATE_ANSWERS)}"
    args = {"mode": "once", "leader": "n1", "nodes": [["n1", "127.0.0.1", "leader"]],
            "node_source": nodeprogs.program_source("watchnode"), "remote_python": late,
            "interval": DELAY_S / 2, "samples": 2, "regex": [], "jobs": None, "gpu": False, "connect_s": 20}
    done = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("watchhub", args), capture_output=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr.decode()
    view = json.loads(done.stdout)
    assert view["answered"] == 1, view   # the answer to the reading printed, however late it came
    (node,) = view["nodes"]
    assert node["state"] == "ok" and node["cpu"] is not None and node["rx"] is not None, node


def test_the_job_recorder_writes_the_record_and_ends_soon_after_the_job(tmp_path):
    """`record` mode (the recorder every job starts): a reading a interval into the job's samples.jsonl, with the
    rank's steps from its output file; the job's ``exit`` file ends it within a few seconds."""
    import os
    import time

    job = "j1128-rec001"
    d = tmp_path / ".clustertool" / "jobs" / job
    out = d / "out" / job / "rank.0"
    out.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"id": job, "name": "rec", "nodes": ["n1"], "output_dir": str(d / "out")}))
    launch = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CLUSTERTOOL_JOB=job))
    try:
        (d / "launch.pid").write_text(f"{launch.pid} 1 1 1\n")
        (out / "stdout").write_text("".join(f"step {i} loss 0.5 time 100.0ms\n" for i in range(3)))
        args = {"mode": "record", "job": job, "leader": "n1", "nodes": [["n1", "127.0.0.1", "leader"]],
                "node_source": nodeprogs.program_source("watchnode"), "remote_python": nodeprogs.stream_command(),
                "interval": 0.3, "samples": 1, "regex": [], "jobs": [job], "gpu": False}
        env = dict(os.environ, HOME=str(tmp_path))
        hub = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        hub.stdin.write(nodeprogs.program_text("watchhub", args))
        hub.stdin.close()
        samples = d / "watch" / "samples.jsonl"
        deadline = time.monotonic() + 60
        while (not samples.exists() or len(samples.read_text().splitlines()) < 4) and hub.poll() is None:
            assert time.monotonic() < deadline, "no readings recorded"
            with open(out / "stdout", "a") as fh:
                fh.write("step 3 loss 0.4 time 100.0ms\n")
            time.sleep(0.3)
        (d / "exit").write_text("0\n")
        ended = time.monotonic()
        assert hub.wait(timeout=30) == 0, hub.stderr.read().decode()
        assert time.monotonic() - ended < 10   # the job's end is looked for every half second
    finally:
        launch.kill()
        launch.wait()
    lines = [json.loads(x) for x in samples.read_text().splitlines()]
    assert lines[0]["header"]["job"] == job and lines[0]["header"]["nodes"] == [["n1", "leader"]]
    assert all(set(x["nodes"]) == {"n1"} for x in lines[1:]) and len(lines) >= 4
    assert lines[-1]["ranks"]["0"][0] == "n1" and lines[-1]["ranks"]["0"][1] >= 2   # [node, step, rate, time]


def test_the_recorders_first_line_waits_for_a_sampler_slow_to_answer(tmp_path):
    """`record` mode with the sampler's answers held back twice the interval (the stand-in for a loaded node, as
    above): the record's first reading has the node's answer and the rank's steps, not an empty reading taken
    before the sampler first spoke (on a loaded machine the record's last line could still be one of those)."""
    import os
    import time

    job = "j1128-rec002"
    d = tmp_path / ".clustertool" / "jobs" / job
    out = d / "out" / job / "rank.0"
    out.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"id": job, "name": "rec", "nodes": ["n1"], "output_dir": str(d / "out")}))
    (out / "stdout").write_text("".join(f"step {i} loss 0.5 time 100.0ms\n" for i in range(3)))
    launch = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CLUSTERTOOL_JOB=job))
    late = f"{nodeprogs.stream_command()} | {sys.executable} -u -c {shlex.quote(LATE_ANSWERS)}"
    try:
        (d / "launch.pid").write_text(f"{launch.pid} 1 1 1\n")
        args = {"mode": "record", "job": job, "leader": "n1", "nodes": [["n1", "127.0.0.1", "leader"]],
                "node_source": nodeprogs.program_source("watchnode"), "remote_python": late,
                "interval": DELAY_S / 2, "samples": 1, "regex": [], "jobs": [job], "gpu": False, "connect_s": 20}
        hub = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, HOME=str(tmp_path)))
        hub.stdin.write(nodeprogs.program_text("watchhub", args))
        hub.stdin.close()
        samples = d / "watch" / "samples.jsonl"
        deadline = time.monotonic() + 60
        while (not samples.exists() or len(samples.read_text().splitlines()) < 2) and hub.poll() is None:
            assert time.monotonic() < deadline, "no reading recorded"
            time.sleep(0.1)
        (d / "exit").write_text("0\n")
        assert hub.wait(timeout=60) == 0, hub.stderr.read().decode()
    finally:
        launch.kill()
        launch.wait()
    first = json.loads(samples.read_text().splitlines()[1])
    assert first["ranks"]["0"][0] == "n1" and first["ranks"]["0"][1] == 2, first   # [node, step, rate, time]
