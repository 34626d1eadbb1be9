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
