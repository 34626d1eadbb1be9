"""Jobs on a real 3-node local cluster with real Open MPI: run, follow, logs, kill, clean, fetch."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import CLI, REPO, run_cli
from tests.local.conftest import module_cluster
from tests.local.nodehost import wait_for

pytestmark = pytest.mark.local

MPI_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s\n", rank, size, host);
    if (rank == 0) printf("sum=%d\n", sum);
    fflush(stdout);
    MPI_Finalize();
    return argc > 1 ? atoi(argv[1]) : 0;
}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 3-node cluster for the module (bringing one up per test would be slow)."""
    yield from module_cluster(tmp_path_factory, 3, "jb")


@pytest.fixture(scope="module")
def mpi_program():
    """A tiny MPI program where every node sees it (nodes share the host's /var/tmp, not /tmp)."""
    if not shutil.which("mpicc"):
        pytest.skip("needs mpicc (libopenmpi-dev)")
    folder = Path("/var/tmp") / f"ct-test-mpi-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "prog.c").write_text(MPI_PROGRAM)
    subprocess.run(["mpicc", "-o", str(folder / "prog"), str(folder / "prog.c")], check=True)
    yield str(folder / "prog")
    shutil.rmtree(folder)


def cli(cluster, *args, timeout=120):
    name, env = cluster
    return run_cli(*args[:1], "-c", name, *args[1:], env=env, timeout=timeout)


def jobs(cluster):
    proc = cli(cluster, "jobs", "--json")
    assert proc.returncode == 0, proc.stderr
    return {j["id"]: j for j in json.loads(proc.stdout)["jobs"]}


def job_processes(cluster, job_id):
    """Per node namespace: pids whose environment carries the job's marker, or `sleep 1000`."""
    name, _ = cluster
    found = {}
    for i in (1, 2, 3):
        ns = net.netns_name(name, i)
        for pid in sysops.pids_in_netns([ns]).get(ns, []):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"CLUSTERTOOL_JOB={job_id}".encode() in environ or cmdline[:2] == [b"sleep", b"1000"]:
                found.setdefault(f"node-{i}", []).append(pid)
    return found


def test_mpi_program_follow_returns_its_exit_code_and_log(cluster, mpi_program):
    proc = cli(cluster, "run", "--follow", "--", mpi_program)
    assert proc.returncode == 0, proc.stderr
    assert "sum=3" in proc.stdout
    assert sorted(line.split("]<stdout>:", 1)[1] for line in proc.stdout.splitlines() if " of 3 on " in line) == [
        "rank 0 of 3 on node-1", "rank 1 of 3 on node-2", "rank 2 of 3 on node-3"]
    failing = cli(cluster, "run", "--follow", "--name", "bad", "--", mpi_program, "7")
    assert failing.returncode == 7
    job = [j for j in jobs(cluster).values() if j["name"] == "bad"][0]
    assert job["state"] == "failed" and job["exit_code"] == 7
    log = cli(cluster, "logs", "bad")
    assert log.returncode == 0 and "sum=3" in log.stdout


def test_logs_node_shows_only_that_nodes_ranks(cluster):
    proc = cli(cluster, "run", "--follow", "--name", "hosts", "--", "hostname")
    assert proc.returncode == 0
    everything = cli(cluster, "logs", "hosts")
    assert sorted(line for line in everything.stdout.splitlines() if "]<stdout>:" in line) == [
        "[1,0]<stdout>:node-1", "[1,1]<stdout>:node-2", "[1,2]<stdout>:node-3"]
    only = cli(cluster, "logs", "hosts", "--node", "node-2")  # mpirun's own (untagged) lines stay
    assert [line for line in only.stdout.splitlines() if "]<stdout>:" in line] == ["[1,1]<stdout>:node-2"]


def test_logs_follow_streams_a_running_job_and_exits_with_its_code(cluster):
    started = cli(cluster, "run", "--np", "1", "--workdir", "/scratch", "--no-tag-output", "--",
                  "sh", "-c", "for i in 1 2 3; do echo step $i; sleep 0.4; done; pwd; exit 5")
    assert started.returncode == 0, started.stderr
    followed = cli(cluster, "logs", "-f", started.stdout.strip())
    assert followed.returncode == 5
    # Open MPI's rsh launcher may log a harmless setpgid race ("[node-1:NNN] plm:rsh: Warning: ...")
    ours = [ln for ln in followed.stdout.splitlines() if "plm:rsh" not in ln]
    assert ours[:4] == ["step 1", "step 2", "step 3", "/scratch"]


def test_job_survives_the_client_being_killed(cluster):
    name, env = cluster
    client = subprocess.Popen(CLI + ["run", "-c", name, "--follow", "--name", "survivor", "--np", "1", "--",
                                     "sh", "-c", "sleep 3; echo survived"],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # killed once the job has started on the leader (it says so on stderr), while it still runs
    lines = iter(client.stderr.readline, b"")
    started = next((ln.decode() for ln in lines if b" started on " in ln), "")
    assert started.startswith("job "), started
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = [j for j in jobs(cluster).values() if j["name"] == "survivor"][0]
        if job["state"] != "running":
            break
        time.sleep(0.5)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert "survived" in cli(cluster, "logs", job["id"]).stdout


def test_kill_leaves_no_process_of_the_job_on_any_node(cluster):
    started = cli(cluster, "run", "--", "sleep", "1000")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    deadline = time.monotonic() + 20
    while len(job_processes(cluster, job_id)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(job_processes(cluster, job_id)) == ["node-1", "node-2", "node-3"]
    busy = cli(cluster, "run", "--", "hostname")
    assert busy.returncode == 2 and f"job {job_id} is still running" in busy.stderr
    killed = cli(cluster, "kill", "--grace", "2", "--json")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    report = json.loads(killed.stdout)
    assert report["clean"] and all(n["remaining"] == [] for n in report["nodes"])
    assert job_processes(cluster, job_id) == {}
    assert jobs(cluster)[job_id]["state"] == "killed"
    again = cli(cluster, "kill", job_id)
    assert again.returncode == 2 and f"job {job_id} is not running: it was killed" in again.stderr


def test_np_larger_than_slots_is_refused_unless_oversubscribe(cluster):
    refused = cli(cluster, "run", "--np", "5", "--", "hostname")
    assert refused.returncode == 2
    assert "--np 5 is more than the 3 slot(s)" in refused.stderr and "Traceback" not in refused.stderr
    ran = cli(cluster, "run", "--np", "5", "--oversubscribe", "--no-tag-output", "--follow", "--", "hostname")
    assert ran.returncode == 0, ran.stderr
    # (mpirun may add its own warning lines, e.g. a setpgid race in plm:rsh; only hostnames count)
    names = [line for line in ran.stdout.splitlines() if line.startswith("node-")]
    assert sorted(names) == ["node-1", "node-1", "node-2", "node-2", "node-3"]


def test_unknown_job_id_is_one_clear_line(cluster):
    for args in (("logs", "nosuchjob"), ("kill", "nosuchjob"), ("fetch", "nosuchjob", "out")):
        proc = cli(cluster, *args)
        assert proc.returncode == 2 and "no job 'nosuchjob'" in proc.stderr and "Traceback" not in proc.stderr


def test_fetch_copies_a_jobs_output_folder_back(cluster, tmp_path):
    made = cli(cluster, "run", "--follow", "--np", "1", "--name", "writer", "--",
               "sh", "-c", "mkdir -p out && echo 'it worked' > out/result.txt")
    assert made.returncode == 0, made.stderr
    proc = cli(cluster, "fetch", "writer", "out", "--to", str(tmp_path / "got"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "got" / "out" / "result.txt").read_text() == "it worked\n"


def test_clean_removes_finished_jobs_everywhere(cluster):
    assert cli(cluster, "clean", "--jobs").returncode == 0
    assert jobs(cluster) == {}
    listing = cli(cluster, "exec", "--no-live", "--", "ls ~/.clustertool/jobs | wc -l")
    assert listing.stdout.count("0\n") >= 1 and "exit 0" in listing.stdout


def test_ctrl_c_while_following_detaches_and_the_job_keeps_running(cluster):
    name, env = cluster
    client = subprocess.Popen(CLI + ["run", "-c", name, "--follow", "--name", "detach", "--", "sleep", "1000"],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said, killed = [], False
    try:
        while not (said and " started on " in said[-1]):  # from this line on, Ctrl-C must detach
            said.append(client.stderr.readline())
            assert said[-1], "".join(said)  # ended without starting the job
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=60)
        assert client.returncode == 130 and "keeps running" in err, (client.returncode, out[-2000:], err[-3000:])
        job = [j for j in jobs(cluster).values() if j["name"] == "detach"][0]
        assert job["state"] == "running"
        # detached: the ranks reach (and stay on) all three nodes; mpirun may still be starting the other two
        wait_for(lambda: len(job_processes(cluster, job["id"])) == 3, "the job's ranks on all three nodes")
        killed = cli(cluster, "kill", job["id"], "--grace", "1").returncode == 0
        assert killed
        assert job_processes(cluster, job["id"]) == {}
    finally:  # the next tests need these nodes free, whatever went wrong here
        if client.poll() is None:
            client.kill()
            client.communicate()
        if not killed:
            cli(cluster, "kill", "--grace", "1")


def test_dry_run_prints_the_exact_command_and_plugin_adds_its_environment(cluster):
    name, env = cluster
    dry = cli(cluster, "run", "--dry-run", "-x", "MSG=a b", "--nccl-debug", "INFO", "--", "python", "t.py")
    assert dry.returncode == 0 and "'MSG=a b'" in dry.stdout and "-x NCCL_DEBUG=INFO" in dry.stdout
    assert "--allow-run-as-root" in dry.stdout and "btl_tcp_if_include 10.213." in dry.stdout
    missing = cli(cluster, "run", "--plugin", "--dry-run", "--", "hostname")
    assert missing.returncode == 1 and "not deployed" in missing.stderr
    record = Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "plugin.json"
    record.write_text(json.dumps({"deployed": {"dest": "/root/.clustertool/lib"}}))
    try:
        planned = cli(cluster, "run", "--plugin", "--dry-run", "--", "hostname")
        # by name (NCCL 2.19/2.20 take no path), found through LD_LIBRARY_PATH with the plugin folder first
        assert "-x NCCL_NET_PLUGIN=clustertool" in planned.stdout
        assert "LD_LIBRARY_PATH=/root/.clustertool/lib" in planned.stdout
    finally:
        record.unlink()


def test_all_python_is_the_explicit_blunt_fallback(cluster):
    name, _ = cluster
    cli(cluster, "exec", "-n", "node-3", "--", "setsid python3 -c 'import time; time.sleep(600)' >/dev/null 2>&1 "
                                               "</dev/null &")
    proc = cli(cluster, "kill", "--all-python", "--json")
    assert proc.returncode == 0, proc.stderr
    report = {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}
    assert len(report["node-3"]["signaled"]) == 1 and report["node-3"]["remaining"] == []
    ns = net.netns_name(name, 3)
    assert "python3" not in [sysops.comm(p) for p in sysops.pids_in_netns([ns]).get(ns, [])]


def test_attach_joins_the_jobs_tmux_session_until_it_ends(cluster, tmp_path):
    if not shutil.which("script"):
        pytest.skip("needs script(1) from util-linux for a terminal")
    name, env = cluster
    started = cli(cluster, "run", "--np", "1", "--no-tag-output", "--",
                  "sh", "-c", "sleep 2; echo seen-through-attach; sleep 1")
    job_id = started.stdout.strip()
    assert started.returncode == 0 and job_id, started.stderr  # (no id: attach would join another job)
    typescript = tmp_path / "typescript"
    attach = " ".join(CLI + ["attach", "-c", name, job_id])
    proc = subprocess.run(["script", "-qec", attach, str(typescript)], env=dict(env, TERM="xterm"), cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert proc.returncode == 0
    screen = typescript.read_bytes()
    assert b"seen-through-attach" in screen and b"[exited]" in screen
    finished = cli(cluster, "attach", job_id)
    assert finished.returncode == 2 and "is not running (succeeded)" in finished.stderr


def test_nodes_selection_and_per_node_shape_the_job(cluster):
    two = cli(cluster, "run", "--nodes", "node-[1-2]", "--no-tag-output", "--follow", "--", "hostname")
    assert two.returncode == 0, two.stderr
    assert sorted(line for line in two.stdout.splitlines() if line.startswith("node-")) == ["node-1", "node-2"]
    doubled = cli(cluster, "run", "--per-node", "2", "--oversubscribe", "--no-tag-output", "--follow", "--",
                  "hostname")
    assert sorted(line for line in doubled.stdout.splitlines() if line.startswith("node-")) == [
        "node-1", "node-1", "node-2", "node-2", "node-3", "node-3"]
