"""`up --shared-fs` / `repair-mounts` through the real CLI: bad input is one clean line, exit 2, nothing made;
the dry-run plan says what would be mounted."""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.cli


def _one_line(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("error: ") and len(first) < 160, first
    for needle in needles:
        assert needle in first, first


@pytest.mark.parametrize("flags, needles", [
    (["--shared-fs", "nfs"], ["--shared-fs: shared filesystem 'nfs': unknown kind 'nfs'"]),
    (["--shared-fs", "local:fs-1"], ["takes no id"]),
    (["--shared-fs", "local@data"], ["is relative"]),
    (["--shared-fs", "local@/x", "--shared-fs", "local@/x"], ["/x is the mount point of another"]),
    (["--shared-mount", "/x"], ["--shared-mount: needs --shared-fs"]),
    (["--shared-fs", "efs"], ["the local provider has no shared filesystem of kind 'efs'"]),
])
def test_bad_shared_fs_input_is_one_line_and_makes_nothing(ct_env, flags, needles):
    proc = run_cli("up", "--provider", "local", "--nodes", "2", "--name", "sfbad", *flags, env=ct_env)
    _one_line(proc, *needles)
    assert not os.path.exists(os.path.join(ct_env["CLUSTERTOOL_HOME"], "clusters", "sfbad.json"))


def test_the_dry_run_plan_names_each_shared_filesystem(ct_env):
    if os.geteuid() != 0:
        pytest.skip("the local provider's check needs root")
    proc = run_cli("up", "--provider", "local", "--nodes", "2", "--name", "sfplan", "--shared-fs", "local",
                   "--shared-fs", "local@/ckpt", "--dry-run", env=ct_env)
    assert proc.returncode == 0, proc.stderr
    assert "shared filesystem local@/shared: made or attached at up, mounted on every node at /shared" in proc.stdout
    assert "shared filesystem local@/ckpt" in proc.stdout


def test_the_python_api_takes_shared_fs(ct_env):
    if os.geteuid() != 0:
        pytest.skip("the local provider's check needs root")
    from clustertool.api import Cluster

    plan = Cluster.plan(provider="local", nodes=2, name="sfapi", shared_fs=["local"], shared_mount="/data")
    assert any(line.startswith("shared filesystem local@/data:") for line in plan)
