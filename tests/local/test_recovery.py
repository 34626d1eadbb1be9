"""Lose a node, keep the job: run --restarts N --replace-failed on a real 4-node local cluster.

Real parts: sshd nodes in namespaces, Open MPI, PyTorch DDP over gloo (CPU), `replace` of the local
provider.  The job's script (examples/ddp_checkpoint.py) checkpoints after every step on rank 0's disk,
which is the leader's (``~/ckpt-<job>.pt`` in node-1's home): a replaced member comes back with an
empty disk and loses nothing, because on a restart rank 0 loads the checkpoint and DDP hands its
parameters to every rank.

`run --follow --replace-failed` runs the recovery loop on this machine (where the credentials would
be); the leader's restart loop waits for it.  The spot case uses a stand-in for the EC2 instance
metadata (IMDSv2 token, then ``spot/instance-action``): a small HTTP server of this test on the
cluster's bridge, one path per node, which announces a notice for node-2 when the test says so and
answers it once (the instance it was for is gone after that).  Only tests point the metadata there
(CLUSTERTOOL_IMDS_URL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from clustertool.workloads import node_python
from tests.conftest import CLI, REPO, run_cli
from tests.local.conftest import _bridge_address, _free_port, module_cluster, provider_state

pytestmark = pytest.mark.local
pytest.importorskip("torch", reason="PyTorch (CPU) is installed by `make venv`; NO_TORCH=1 skips it")



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "rc", "--slots", "1")


@pytest.fixture(scope="module")
def script():
    folder = Path("/var/tmp") / f"ct-test-recovery-{uuid.uuid4().hex[:8]}"  # every local node sees /var/tmp
    (folder / "marks").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "ddp_checkpoint.py", folder / "train.py")
    yield folder
    for f in (folder / "marks").iterdir():
        f.unlink()
    (folder / "marks").rmdir()
    (folder / "train.py").unlink()
    folder.rmdir()


def _start(cluster, script, *flags, env_extra=None):
    """`run --follow --restarts 1 --replace-failed` in the background; (process, job id)."""
    name, env = cluster
    argv = CLI + ["run", "-c", name, "--restarts", "1", "--replace-failed", "--follow", "--no-tag-output",
                  "-x", f"MARKS={script / 'marks'}", *flags, "--", *node_python(), str(script / "train.py")]
    proc = subprocess.Popen(argv, env=dict(env, **(env_extra or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    lines = _drain(proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"job (j[0-9a-f-]+) started", "".join(lines))
        if found:
            return proc, found.group(1), lines
        time.sleep(0.1)
    raise AssertionError(f"the job did not start: {''.join(lines)}")


def _checkpoint_step(cluster, job_id) -> int:
    """The step in the job's checkpoint on the leader's disk (0: none yet)."""
    path = Path(provider_state(cluster[1], cluster[0])["nodes_dir"]) / "node-1" / "home" / f"ckpt-{job_id}.pt"
    if not path.exists():
        return 0
    import torch

    try:
        return int(torch.load(path)["step"])
    except Exception:  # written at this moment: read it again
        return 0


def _wait_step(cluster, job_id, proc, step, timeout=120):
    deadline = time.monotonic() + timeout
    while _checkpoint_step(cluster, job_id) < step:
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not reach its checkpoint"
        time.sleep(0.1)


def _drain(proc) -> list[str]:
    """Read the process's stdout and stderr as they come (each in a thread); its stderr lines so far."""
    proc.out_lines, proc.err_lines = [], []
    proc.readers = [threading.Thread(target=lambda: proc.out_lines.extend(proc.stdout), daemon=True),
                    threading.Thread(target=lambda: proc.err_lines.extend(proc.stderr), daemon=True)]
    for t in proc.readers:
        t.start()
    return proc.err_lines


def _finish(proc, _stderr_lines=None, timeout=240):
    """(exit code, stdout, stderr) once the process ended and both streams are read to their end."""
    proc.wait(timeout=timeout)
    for t in proc.readers:
        t.join(timeout=30)
    return proc.returncode, "".join(proc.out_lines), "".join(proc.err_lines)


def _job(cluster, job_id) -> dict:
    name, env = cluster
    proc = run_cli("jobs", "-c", name, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return next(j for j in json.loads(proc.stdout)["jobs"] if j["id"] == job_id)


def _status(cluster) -> dict:
    proc = run_cli("status", "-c", cluster[0], "--json", env=cluster[1])
    assert proc.returncode == 0, proc.stderr
    return {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}


def _ranks_on_nodes(out: str, attempt: int) -> set[int]:
    return {int(r) for r in re.findall(rf"rank (\d) attempt {attempt} resumed at step \d+", out)}


def test_a_node_killed_mid_job_is_replaced_and_the_job_resumes_from_its_checkpoint(cluster, script):
    name, env = cluster
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    assert run_cli("exec", "-c", name, "-n", "node-3", "--", "touch", "/scratch/old-disk", env=env).returncode == 0
    before = _status(cluster)
    proc, job_id, err = _start(cluster, script)
    _wait_step(cluster, job_id, proc, 3)

    ns = net.netns_name(name, 3)
    old = sysops.pids_in_netns([ns])[ns]
    sysops.kill_all(old)  # node-3 dies: every process of its namespace, sshd and ranks included

    code, out, err_text = _finish(proc, err)
    assert code == 0, out[-3000:] + err_text[-3000:]
    resumed = [int(s) for s in re.findall(r"rank 0 attempt 1 resumed at step (\d+)", out)]
    assert resumed and resumed[0] >= 3, out  # from the checkpoint on the leader's disk
    assert _ranks_on_nodes(out, 0) == {0, 1, 2, 3}
    assert _ranks_on_nodes(out, 1) == {0, 1, 2, 3}, out  # the stream follows the new node-3 too
    assert "rank 0 done at step 10" in out
    assert "replacing node-3" in err_text and "node-3 replaced" in err_text

    job = _job(cluster, job_id)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert [a["cause"] for a in job["attempts"]] == ["node-3 lost", None]
    assert job["attempts"][0]["replaced"]["nodes"] == ["node-3"]
    table = run_cli("jobs", "-c", name, env=env).stdout
    row = next(line for line in table.splitlines() if line.startswith(job_id))
    assert "succeeded (1 restart: node-3 lost)" in row
    assert re.search(r"attempt 1: \d\d:\d\d:\d\d-\d\d:\d\d:\d\d node-3 lost", table), table

    now = _status(cluster)
    assert now["node-3"]["host_key"] not in (None, before["node-3"]["host_key"]) and now["node-3"]["reachable"]
    assert now["node-3"]["address"] == before["node-3"]["address"]
    assert not any(sysops.alive(p) for p in old), "the old node-3's processes are gone"
    assert sorted(p.name for p in nodes_dir.iterdir() if p.name.startswith(".")) == []
    assert not (nodes_dir / "node-3" / "scratch" / "old-disk").exists(), "the old disk is gone"
    old_key = before["node-3"]["host_key"]
    for node in ("node-1", "node-2", "node-4"):
        known = (nodes_dir / node / "home" / ".ssh" / f"clustertool-{name}.known_hosts").read_text()
        assert (nodes_dir / "node-3" / "ssh" / f"{net.HOST_KEY}.pub").read_text().split()[1] in known
        assert old_key not in known


def test_replace_copy_puts_a_dataset_back_on_the_new_node_and_says_the_old_disk_is_gone(cluster):
    name, env = cluster
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    data = nodes_dir / "node-1" / "home" / "dataset"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "part-0.bin").write_bytes(os.urandom(300_000))
    (data / "labels.txt").write_text("a\nb\n")
    keys = {n: s["host_key"] for n, s in _status(cluster).items()}
    refused = run_cli("replace", "node-1", "--copy", "dataset", "--yes", "-c", name, env=env)
    assert refused.returncode != 0 and refused.stderr.startswith("error: --copy: the leader node-1 is being replaced")
    missing = run_cli("replace", "node-4", "--copy", "no-such-data", "--yes", "-c", name, env=env)
    assert missing.returncode != 0 and "not (all) on the leader node-1" in missing.stderr.splitlines()[0]
    assert {n: s["host_key"] for n, s in _status(cluster).items()} == keys  # the refusals replaced nothing

    done = run_cli("replace", "node-4", "--copy", "dataset", "--yes", "-c", name, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "what was on the old disk is gone; dataset copied back from node-1" in done.stdout
    new = nodes_dir / "node-4" / "home" / "dataset"
    assert (new / "sub" / "part-0.bin").read_bytes() == (data / "sub" / "part-0.bin").read_bytes()
    assert (new / "labels.txt").read_text() == "a\nb\n"
    assert _status(cluster)["node-4"]["host_key"] != keys["node-4"]


@pytest.mark.slow  # ~30 s each on this box: `pytest -m slow tests/local/test_recovery.py`
@pytest.mark.parametrize("loop", ["recover", "follow"])
def test_a_lost_leader_is_replaced_by_the_recovery_loop_and_the_job_starts_again_there(cluster, script, loop):
    """The restart loop died with the leader: the recovery loop here (`clustertool recover` left running, or
    the one beside `run --follow --replace-failed`, whose stream then follows the new leader) replaces the
    leader and starts the job again there, same id, next restart count.  The checkpoint was on the old
    leader's disk, so the job starts from step 0: the test says so, as the README does."""
    name, env = cluster
    if loop == "follow":
        proc, job_id, err = _start(cluster, script)
    else:
        started = run_cli("run", "-c", name, "--restarts", "1", "--replace-failed", "--no-tag-output", "--",
                          *node_python(), str(script / "train.py"), env=env)
        assert started.returncode == 0, started.stderr
        job_id = started.stdout.strip().splitlines()[-1]
        proc = subprocess.Popen(CLI + ["recover", "-c", name, job_id, "--poll", "1"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        err = _drain(proc)
    _wait_step(cluster, job_id, proc, 2)
    old = sysops.pids_in_netns([net.netns_name(name, 1)])[net.netns_name(name, 1)]
    sysops.kill_all(old)  # the leader dies: the job's mpirun and restart loop with it
    code, out, err_text = _finish(proc, err, timeout=300)
    assert code == 0, out[-3000:] + err_text[-3000:]
    assert "the leader node-1 does not answer: replacing it" in err_text
    assert "starting it again on the new node-1" in err_text
    job = _job(cluster, job_id)
    assert job["state"] == "succeeded", job
    assert [a["cause"] for a in job["attempts"]] == ["node-1 lost (the leader)", None]
    logs = run_cli("logs", "-c", name, job_id, "--attempt", "2", env=env).stdout
    assert "rank 0 attempt 1 resumed at step 0" in logs  # its checkpoint was on the old leader's disk
    if loop == "follow":
        assert "rank 0 attempt 1 resumed at step 0" in out and "rank 0 done at step 10" in out
    assert not any(sysops.alive(p) for p in old)


class _Metadata(BaseHTTPRequestHandler):
    """Stand-in for the EC2 instance metadata (IMDSv2) of every node: /<node>/latest/..."""

    announce: set = set()
    seen: list = []

    def log_message(self, *args):
        pass

    def _node(self):
        return self.path.split("/")[1]

    def do_PUT(self):
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.seen.append(("PUT", self.path, ttl))
        if not self.path.endswith("/latest/api/token") or not ttl:
            self.send_error(400)
            return
        self._reply(200, f"token-{self._node()}")

    def do_GET(self):
        node = self._node()
        token = self.headers.get("X-aws-ec2-metadata-token")
        self.seen.append(("GET", self.path, token))
        if token != f"token-{node}":
            self.send_error(401)
        elif self.path.endswith("/latest/meta-data/spot/instance-action") and node in self.announce:
            self.announce.discard(node)  # answered once: the instance is gone after it
            soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))  # as near as a test can wait
            self._reply(200, json.dumps({"action": "terminate", "time": soon}))
        else:
            self.send_error(404)

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def metadata(cluster):
    host = _bridge_address(cluster[1], cluster[0])
    server = ThreadingHTTPServer((host, _free_port(host)), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://{host}:{server.server_address[1]}/{{node}}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # ~30 s more on this box: out of the default run (`pytest -m slow tests/local/test_recovery.py`);
# tests/unit/test_spot.py covers the watcher itself by default
def test_a_spot_notice_signals_every_rank_and_the_node_is_replaced_and_the_job_resumes(cluster, script, metadata):
    server, url = metadata
    name, env = cluster
    before = _status(cluster)
    proc, job_id, err = _start(cluster, script, "--on-preempt-signal", "USR1",
                               env_extra={"CLUSTERTOOL_IMDS_URL": url})
    _wait_step(cluster, job_id, proc, 2)
    old = sysops.pids_in_netns([net.netns_name(name, 2)])[net.netns_name(name, 2)]
    _Metadata.announce.add("node-2")

    code, out, err_text = _finish(proc, err)
    assert code == 0, out[-3000:] + err_text[-3000:]
    marks = sorted(p.name for p in (script / "marks").iterdir() if job_id in p.name)
    assert marks == [f"signal-{job_id}-0-{r}" for r in range(4)], out[-3000:] + err_text[-3000:]  # every rank: SIGUSR1
    assert all((script / "marks" / m).read_text() == "10" for m in marks)
    resumed = [int(s) for s in re.findall(r"rank 0 attempt 1 resumed at step (\d+)", out)]
    assert resumed and resumed[0] >= 2, out
    job = _job(cluster, job_id)
    assert job["state"] == "succeeded" and [a["cause"] for a in job["attempts"]] == ["node-2 spot interruption", None]
    assert _status(cluster)["node-2"]["host_key"] != before["node-2"]["host_key"]
    assert not any(sysops.alive(p) for p in old)
    # IMDSv2: a token first, then the notice asked with it, from each node's own path
    assert {p.split("/")[1] for m, p, _ in _Metadata.seen if m == "PUT"} == {"node-1", "node-2", "node-3", "node-4"}
    assert all(t for m, _, t in _Metadata.seen)
