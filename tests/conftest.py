"""Shared test helpers: an isolated clustertool environment and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clustertool"]


def unique(prefix: str = "t") -> str:
    """A cluster name no concurrent test run will also pick."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def ct_env(tmp_path, monkeypatch):
    """CLUSTERTOOL_HOME, hostfile dir and HOME in tmp_path, for this process and subprocesses."""
    env = {
        "CLUSTERTOOL_HOME": str(tmp_path / "cthome"),
        "CLUSTERTOOL_HOSTFILE_DIR": str(tmp_path / "hostfiles"),
        "CLUSTERTOOL_NO_SSH_INCLUDE": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return dict(os.environ)


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, input: str | None = None):
    """Run the real CLI as a process; returns CompletedProcess with text output."""
    return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, input=input, cwd=REPO)


def _local_footprint() -> set[str]:
    """Namespaces and bridges of the local provider present on this machine now."""
    if os.geteuid() != 0:
        return set()
    out = set()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out |= {f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("ct-")}
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    out |= {f"bridge {line.split(':')[1].strip()}" for line in links.splitlines() if ": ctbr" in line}
    return out


def pytest_sessionstart(session):
    session.config._ct_footprint = _local_footprint()


def pytest_sessionfinish(session, exitstatus):
    """After the suite, nothing of the local provider that the suite made may remain."""
    before = getattr(session.config, "_ct_footprint", set())
    left = sorted(_local_footprint() - before)
    if left:
        sys.stderr.write("\nLEAK: the test suite left local-provider resources behind:\n  "
                         + "\n  ".join(left) + "\n")
        session.exitstatus = 1
