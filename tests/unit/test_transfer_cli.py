"""`copy` / `sync-s3` bad input: one clear line, exit 2, no node touched (no SSH needed)."""

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import run_cli

pytestmark = [pytest.mark.unit, pytest.mark.cli]


@pytest.fixture
def fake_cluster(ct_env):
    # loopback, port 9 (discard, closed here): an SSH attempt would fail at once and stay local
    nodes = [Node("node-1", 1, "127.0.0.1", role="leader", ssh_port=9),
             Node("node-2", 2, "127.0.0.1", ssh_port=9)]
    state.save(ClusterRecord("fake", "static", nodes=nodes, status="ready"))
    return ct_env


@pytest.mark.parametrize("args, message", [
    (["copy", "-c", "fake", "--strategy", "bogus", "/a", "/b"], "error: --strategy 'bogus': use auto, chain or fanout"),
    (["copy", "-c", "fake", "--from", "laptop", "/a", "/b"], "error: --from must be leader or local, not 'laptop'"),
    (["copy", "-c", "fake", "~bob/a", "/b"], "error: path '~bob/a': '~user' paths are not supported"),
    (["sync-s3", "-c", "fake", "bucket/prefix", "/b"], "error: not an S3 URL: 'bucket/prefix'"),
    (["sync-s3", "-c", "fake", "s3:///prefix", "/b"], "error: no bucket in 's3:///prefix'"),
])
def test_bad_input_is_one_line_and_exit_2(fake_cluster, args, message):
    proc = run_cli(*args, env=fake_cluster, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0] == message
    assert "Traceback" not in proc.stderr


def test_cluster_not_ready_is_refused_before_any_ssh(ct_env):
    state.save(ClusterRecord("fake", "static", nodes=[Node("node-1", 1, "127.0.0.1", role="leader", ssh_port=9)],
                       status="stopped"))
    proc = run_cli("copy", "-c", "fake", "/a", "/b", env=ct_env, timeout=60)
    assert proc.returncode == 2 and "is stopped, not ready" in proc.stderr


def test_help_lists_both_commands_without_importing_boto3(ct_env):
    proc = run_cli("--help", env=ct_env, timeout=60)
    assert "copy" in proc.stdout and "sync-s3" in proc.stdout
    probe = ("import sys, clustertool.cli.app as a; a.build(); "
             "print('boto3' in sys.modules, 'clustertool.transfer.copy' in sys.modules)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ct_env).stdout
    assert out.split() == ["False", "False"]
