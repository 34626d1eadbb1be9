"""Every command that prints a table, with stdout to a pipe (as in `clustertool bench allreduce | tee log`):
no cell is cut ("…"), long names and numbers come out whole, one row per line.

Before, rich laid tables out for 80 columns whenever stdout was not a terminal: sizes came out
as `10485…`, paths and commands cut.  Real parts throughout: a 4-node local cluster with a
31-character name, a copy to a deep path, the NCCL plugin built and deployed, collnet_bench
and Open MPI for `bench allreduce`, a scaling run, a playbook.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local

DEEP = "/scratch/" + "/".join(["a-rather-long-folder-name-for-the-dataset"] * 3)  # ~135 characters
LONG_COMMAND = ["sh", "-c", "echo 'samples/sec: 123456789.25'; : " + "an-argument-that-goes-on-" * 5]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("piped")
    env = dict(os.environ, CLUSTERTOOL_HOME=str(tmp / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp / "hf"),
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    env.pop("COLUMNS", None)
    name = unique("pipedwidetablescheck")[:31]
    up = run_cli("up", "--provider", "local", "--nodes", "4", "--name", name, env=env)
    assert up.returncode == 0, up.stderr
    yield name, env, up.stdout, tmp
    run_cli("down", "-c", name, "--yes", env=env)
    assert local_leftovers(name) == []


def piped(cluster, *args, timeout=300):
    """The command with stdout to a pipe (subprocess captures through one); checks nothing was cut."""
    name, env, _, _ = cluster
    n = 2 if args[0] in ("bench", "plugin") else 1
    proc = run_cli(*args[:n], "-c", name, *args[n:], env=env, timeout=timeout)
    assert "…" not in proc.stdout, f"`{' '.join(args)}` cut a cell:\n{proc.stdout}"
    return proc


def row(stdout: str, *cells: str) -> str:
    """The one line that holds all ``cells`` (a row that wrapped would spread them over several)."""
    lines = [ln for ln in stdout.splitlines() if all(c in ln for c in cells)]
    assert len(lines) == 1, f"no single line holds {cells}:\n{stdout}"
    return lines[0]


def test_up_status_and_ls_show_the_long_cluster_name_whole(cluster):
    name, _, up_out, _ = cluster
    assert "…" not in up_out and row(up_out, "node-4", "member", "10.213.")
    status = piped(cluster, "status")
    assert name in status.stdout and row(status.stdout, "node-1", "leader", "yes")
    listing = run_cli("ls", env=cluster[1])
    assert "…" not in listing.stdout and row(listing.stdout, name, "local", "4")


def test_copy_table_keeps_a_deep_destination_whole(cluster):
    _, _, _, tmp = cluster
    src = tmp / "dataset-with-a-long-name-too"
    src.mkdir()
    (src / "part-0001.bin").write_bytes(os.urandom(50_000))
    proc = piped(cluster, "copy", str(src), DEEP, "--from", "local")
    assert proc.returncode == 0, proc.stderr
    assert DEEP in proc.stdout and row(proc.stdout, "node-3", "ok")


def test_jobs_and_kill_tables_keep_the_whole_command(cluster):
    ran = piped(cluster, "run", "--follow", "--name", "a-job-with-a-long-name", "--np", "1", "--", *LONG_COMMAND)
    assert ran.returncode == 0, ran.stderr
    jobs = piped(cluster, "jobs")
    assert row(jobs.stdout, "a-job-with-a-long-name", "succeeded", "an-argument-that-goes-on-" * 5)
    started = piped(cluster, "run", "--", "sleep", "600")
    killed = piped(cluster, "kill", started.stdout.strip(), "--grace", "1")
    assert killed.returncode == 0 and row(killed.stdout, "node-4", "no nvidia-smi")


def test_bench_scaling_table_and_json_on_stdout(cluster):
    proc = piped(cluster, "bench", "scaling", "--nodes", "1,2", "--quiet", "--", *LONG_COMMAND)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert row(proc.stdout, "123456789.2", "100%") and "an-argument-that-goes-on-" * 5 in proc.stdout
    as_json = piped(cluster, "bench", "scaling", "--nodes", "1", "--json", "--", *LONG_COMMAND)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    assert json.loads(as_json.stdout)["points"][0]["throughput"] == pytest.approx(123456789.25)


def test_plugin_status_and_bench_allreduce_tables_show_sizes_whole(cluster):
    built = piped(cluster, "plugin", "build", timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    assert piped(cluster, "plugin", "deploy").returncode == 0
    status = piped(cluster, "plugin", "status")
    assert status.returncode == 0 and row(status.stdout, "node-4", "yes")
    bench = piped(cluster, "bench", "allreduce", "--sizes", "1M:16M", "--algo", "ring,mpi", "-n", "1", "--quiet",
                  timeout=600)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert row(bench.stdout, "16777216", "4194304", "float", "sum", "ring")  # size and count, as nccl-tests
    assert row(bench.stdout, "16M", "x")  # the side-by-side table: sizes as people write them


def test_playbook_report_and_summary_and_doctor_and_exec(cluster):
    name, env, _, tmp = cluster
    book = tmp / "wide.yaml"
    book.write_text(f"cluster: {name}\nsteps:\n"
                    "  - name: a step whose name is long enough to be cut in eighty columns of a table\n"
                    "    exec: {command: 'echo the output of a step'}\n")
    played = run_cli("play", str(book), env=env, timeout=300)
    assert played.returncode == 0, played.stderr
    assert "…" not in played.stdout and row(played.stdout, "a step whose name is long enough", "ok")
    doctor = piped(cluster, "doctor", "--check", "reach", "--check", "disk")
    assert "[ok  ] reach" in doctor.stdout
    assert "…" not in piped(cluster, "exec", "--", "echo " + "x" * 150).stdout
