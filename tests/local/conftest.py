"""Fixtures for the local tier: real sshd nodes in real network namespaces (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import run_cli, unique

pytestmark = pytest.mark.local


def _prerequisites_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"needs {tool}"
    if not os.path.exists("/usr/sbin/sshd"):
        return "needs openssh-server (/usr/sbin/sshd)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _prerequisites_missing()
    for item in items:
        if "tests/local/" in str(item.fspath):
            item.add_marker(pytest.mark.local)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"local provider tier: {reason}"))


def local_leftovers(name: str) -> list[str]:
    """Everything of cluster `name` the local provider could have left on this machine."""
    left = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"ct-{name}-")]
    procs = subprocess.run(["pgrep", "-af", f"clusters/{name}/"], capture_output=True, text=True).stdout
    left += [f"process {line}" for line in procs.splitlines()]
    return left


@pytest.fixture
def local_cluster(ct_env):
    """Factory: make(nodes=3, *flags) brings a local cluster up via the CLI; down at teardown."""
    made: list[str] = []

    def make(nodes: int = 3, *flags: str, name: str | None = None) -> str:
        name = name or unique("lc")
        proc = run_cli("up", "--provider", "local", "--nodes", str(nodes), "--name", name, *flags, env=ct_env)
        assert proc.returncode == 0, f"up failed: {proc.stderr}"
        made.append(name)
        return name

    yield make
    for name in made:
        run_cli("down", "-c", name, "--yes", env=ct_env)
        assert local_leftovers(name) == [], f"cluster {name} left things behind"
