"""Bad input: one line saying what is wrong, a non-zero exit, no traceback, state untouched."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import run_cli

pytestmark = pytest.mark.cli


def _snapshot(home):
    return sorted((p, os.path.getmtime(os.path.join(d, p))) for d, _, files in os.walk(home) for p in files)


@pytest.fixture
def known_cluster(ct_env):
    """A recorded cluster (no machines needed: every case below fails before any SSH)."""
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member")
             for i in range(1, 4)]
    state.save(ClusterRecord(name="known", provider="local", nodes=nodes, status="ready"))
    return "known"


def _assert_one_clean_line(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("error: "), proc.stderr
    assert len(first) < 160, first   # one line a terminal shows whole
    for needle in needles:
        assert needle in first, first


def test_malformed_yaml_names_the_file_and_line(ct_env, tmp_path, known_cluster):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nnodes: [1,\n")
    before = _snapshot(ct_env["CLUSTERTOOL_HOME"])
    proc = run_cli("up", str(spec), env=ct_env)
    _assert_one_clean_line(proc, "bad.yaml")
    assert _snapshot(ct_env["CLUSTERTOOL_HOME"]) == before


def test_unknown_spec_key_is_named(ct_env, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\nprovider: local\nnodes: 2\nlink_rte: 200mbit\n")
    _assert_one_clean_line(run_cli("up", str(spec), env=ct_env), "link_rte", "did you mean 'link_rate'?",
                           "clustertool up --help")


@pytest.mark.parametrize("count", ["0", "-3"])
def test_zero_or_negative_node_counts_are_refused(ct_env, count):
    proc = run_cli("up", "--provider", "local", "--name", "x", "--nodes", count, env=ct_env)
    _assert_one_clean_line(proc, "nodes")
    assert state.list_clusters() == []


def test_unknown_cluster_lists_the_known_ones(ct_env, known_cluster):
    proc = run_cli("status", "-c", "ghost", env=ct_env)
    _assert_one_clean_line(proc, "ghost")
    assert "known" in proc.stderr


@pytest.mark.parametrize("selection", ["node-1;touch /tmp/ct-pwned", "$(touch /tmp/ct-pwned)", "node-9"])
def test_bad_node_selections_are_refused_before_any_shell(ct_env, known_cluster, selection):
    proc = run_cli("exec", "-c", known_cluster, "--nodes", selection, "--", "true", env=ct_env)
    _assert_one_clean_line(proc)
    assert not os.path.exists("/tmp/ct-pwned")


def test_existing_cluster_name_is_refused_and_kept(ct_env, known_cluster):
    before = _snapshot(ct_env["CLUSTERTOOL_HOME"])
    proc = run_cli("up", "--provider", "local", "--name", known_cluster, "--nodes", "2", env=ct_env)
    _assert_one_clean_line(proc, "already exists")
    assert _snapshot(ct_env["CLUSTERTOOL_HOME"]) == before


def test_down_without_yes_and_no_terminal_refuses(ct_env, known_cluster):
    proc = run_cli("down", "-c", known_cluster, env=ct_env, input="")
    _assert_one_clean_line(proc, "--yes")
    assert state.exists(known_cluster)


def test_unknown_hostfile_format(ct_env, known_cluster):
    _assert_one_clean_line(run_cli("hostfile", "--format", "slurm", env=ct_env), "slurm")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_local_provider_as_non_root_says_root_is_needed():
    # a folder the other user can reach (pytest's own tmp folders are root's alone)
    top = Path(tempfile.mkdtemp(prefix="ct-test-nonroot-", dir="/var/tmp"))
    os.chmod(top, stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)
    home = top / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    try:
        _up_as_nobody(home)
    finally:
        shutil.rmtree(top)


def _up_as_nobody(home):
    env = dict(os.environ, CLUSTERTOOL_HOME=str(home), CLUSTERTOOL_HOSTFILE_DIR=str(home / "hf"),
               CLUSTERTOOL_NO_SSH_INCLUDE="1", HOME=str(home))
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-m", "clustertool", "up", "--provider", "local",
                           "--nodes", "2", "--name", "x"], env=env, capture_output=True, text=True,
                          cwd=str(home))
    _assert_one_clean_line(proc, "the local provider needs root")
    assert not (home / "clusters" / "x.json").exists()


def test_help_does_not_import_boto3():
    code = ("import sys\nfrom clustertool.cli.app import run\nrun(['--help'])\nrun(['up', '--help'])\n"
            "sys.stderr.write('BOTO3' if 'boto3' in sys.modules else 'CLEAN')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stderr.strip().endswith("CLEAN"), proc.stderr[-500:]
    assert "up" in proc.stdout and "exec" in proc.stdout


@pytest.mark.parametrize("argv", [["exec", "--"], ["status", "--bogus"], ["up", "--nodes", "abc"]])
def test_usage_errors_are_one_line_with_exit_2(ct_env, argv):
    proc = run_cli(*argv, env=ct_env)
    assert proc.returncode == 2
    _assert_one_clean_line(proc)
    assert "internal error" not in proc.stderr
