"""`run --sync [DIR]` on a real local cluster: the code reaches every node (less what is ignored),
the job runs there, and a second run sends only what changed."""

from __future__ import annotations

import json
import subprocess

import pytest

from clustertool import Cluster
from tests.conftest import CLI, run_cli
from tests.local.conftest import module_cluster

BIG = 4 << 20  # the ignored data file: never on a node


@pytest.fixture(scope="module")
def sync_cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "rs")


@pytest.fixture
def project(tmp_path):
    """A project folder (under /tmp: each local node has a private /tmp, so the nodes start without it)."""
    root = tmp_path / "proj"
    (root / "util").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "train.py").write_text(
        "import os, socket\nfrom util import helper\n"
        "print(socket.gethostname(), os.getcwd(), helper.VERSION, flush=True)\n")
    (root / "util" / "__init__.py").write_text("")
    (root / "util" / "helper.py").write_text("VERSION = 'v1'\n")
    (root / ".gitignore").write_text("*.bin\n__pycache__/\n")
    (root / ".clustertoolignore").write_text("data/\n")
    (root / "weights.bin").write_bytes(b"\0" * BIG)
    (root / "data" / "shard-0.csv").write_text("1,2,3\n")
    return root


def run_synced(name, env, *args, cwd=None):
    """`clustertool run --sync ... --json`, then wait for the job: (job record with "sync", its lines)."""
    proc = subprocess.run(CLI + ["run", "-c", name, "--json", *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    logs = run_cli("logs", "-c", name, "-f", job["id"], env=env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    return job, ranks_lines(logs.stdout.splitlines())


def ranks_lines(lines):
    """The ranks' lines (mpirun may add its own untagged warnings, e.g. plm:rsh setpgid)."""
    return [line for line in lines if line.startswith("[1,")]


def on_nodes(name, env, line):
    proc = run_cli("exec", "-c", name, "--json", "--", line, env=env)
    return {r["node"]: r["stdout"] for r in json.loads(proc.stdout)["results"]}


def test_run_sync_sends_the_folder_runs_there_and_resends_only_what_changed(sync_cluster, project):
    name, env = sync_cluster
    job, lines = run_synced(name, env, "--sync", "--per-node", "1", "--", "python3", "train.py", cwd=project)
    assert job["workdir"] == str(project)
    assert sorted(lines) == sorted(f"[1,{i}]<stdout>:node-{i + 1} {project} v1" for i in range(4))
    first = job["sync"]
    assert first["strategy"] == "chain" and first["verified"] and first["exit_code"] == 0
    assert first["total_files"] == 5  # train.py, util/__init__.py, util/helper.py, .gitignore, .clustertoolignore
    assert [n["status"] for n in first["nodes"]] == ["ok"] * 4
    listing = on_nodes(name, env, f"cd {project} && find . -type f -not -path '*/__pycache__/*' | sort")
    expected = "./.clustertoolignore\n./.gitignore\n./train.py\n./util/__init__.py\n./util/helper.py\n"
    assert all(found == expected for found in listing.values()), listing  # no weights.bin, no data/

    (project / "util" / "helper.py").write_text("VERSION = 'v2-longer'\n")
    (project / "weights.bin").write_bytes(b"\1" * BIG)  # ignored: changing it sends nothing
    job, lines = run_synced(name, env, "--sync", str(project), "--per-node", "1", "--", "python3", "train.py")
    second = job["sync"]
    assert second["bytes_sent"] == len("VERSION = 'v2-longer'\n")
    assert [(n["node"], n["files_sent"]) for n in second["nodes"]] == [(f"node-{i}", 1) for i in range(1, 5)]
    assert sorted(lines) == sorted(f"[1,{i}]<stdout>:node-{i + 1} {project} v2-longer" for i in range(4))

    job, _ = run_synced(name, env, "--sync", str(project), "--per-node", "1", "--", "python3", "train.py")
    assert job["sync"]["bytes_sent"] == 0 and all(n["files_sent"] == 0 for n in job["sync"]["nodes"])


def test_the_jobs_own_outputs_in_the_synced_folder_survive_the_next_sync(sync_cluster, project):
    name, env = sync_cluster
    (project / "train.py").write_text("open('result.txt', 'w').write('done')\n")
    run_synced(name, env, "--sync", str(project), "--nodes", "leader", "--", "python3", "train.py")
    run_synced(name, env, "--sync", str(project), "--nodes", "leader", "--", "true")
    assert on_nodes(name, env, f"cat {project}/result.txt || true")["node-1"] == "done"


def test_the_api_runs_synced_code_to_another_folder(sync_cluster, project, monkeypatch):
    name, env = sync_cluster
    for key in ("CLUSTERTOOL_HOME", "CLUSTERTOOL_HOSTFILE_DIR"):
        monkeypatch.setenv(key, env[key])
    cluster = Cluster.load(name)
    job = cluster.run("python3 train.py", sync=project, sync_to="/scratch/proj", per_node=1)
    assert job.wait(timeout=120) == 0
    assert job.synced.dest == "/scratch/proj" and job.synced.nodes[0].files_sent == 5
    assert sorted(ranks_lines(job.logs())) == sorted(f"[1,{i}]<stdout>:node-{i + 1} /scratch/proj v1"
                                                     for i in range(4))


def test_a_sync_that_cannot_write_starts_no_job(sync_cluster, project):
    name, env = sync_cluster
    proc = run_cli("run", "-c", name, "--sync", str(project), "--sync-to", "/proc/nope", "--", "echo", "never-ran",
                   env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--sync:" in proc.stderr and "no job was started" in proc.stderr, proc.stderr
    jobs = json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"]
    assert all(j["command"] != ["echo", "never-ran"] for j in jobs)
