"""Shared test helpers: an isolated clustertool environment and a CLI runner."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A run started under `nohup` (or any parent that ignores SIGHUP) hands every process it starts an
# ignored SIGHUP, and clustertool rightly keeps a signal its caller chose to ignore: the tests of what
# SIGHUP does (a closed terminal) would then see it ignored. They test a terminal user's process, so
# this run, and every clustertool it starts, gets SIGHUP's default disposition back.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
CLI = [sys.executable, "-m", "clustertool"]

# This pytest run's mark: every cluster it makes is named PREFIX-<SESSION><4 hex>, so the leak
# check below counts only what this run made, whatever other runs or users do on the machine.
# Under pytest-xdist (`make test`) the workers are processes the controller starts after importing
# this file: they take its mark from the environment, so one run is one mark, and the controller's
# check at the end sees what every worker made.
_RUN_VAR = "CLUSTERTOOL_TEST_RUN"
if os.environ.get("PYTEST_XDIST_WORKER") and re.fullmatch(r"[0-9a-f]{6}", os.environ.get(_RUN_VAR, "")):
    SESSION = os.environ[_RUN_VAR]
else:
    SESSION = secrets.token_hex(3)
    os.environ[_RUN_VAR] = SESSION
_OURS = re.compile(rf"^[a-z][a-z0-9]*-{SESSION}[0-9a-f]{{4}}$")


def unique(prefix: str = "t") -> str:
    """A cluster name of this test run that no concurrent run will also pick."""
    return f"{prefix}-{SESSION}{secrets.token_hex(2)}"


def ours(cluster: str) -> bool:
    """Whether a cluster name is one this test run made (with unique())."""
    return bool(_OURS.match(cluster))


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
    yield dict(os.environ)
    # the ssh sockets' folders live in the system temp dir (socket paths are short): a test that wrote a
    # cluster's ssh config without `down` removing it would leave its folder there
    from clustertool.core.state import ClusterPaths, clusters_dir

    for root in clusters_dir().glob("*"):
        if root.is_dir():  # beside them lie the records, <name>.json
            shutil.rmtree(ClusterPaths(root.name).control_dir, ignore_errors=True)


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, input: str | None = None):
    """Run the real CLI as a process; returns CompletedProcess with text output."""
    return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, input=input, cwd=REPO)


def _netns_cluster(netns: str) -> str:
    """``ct-<cluster>-<i>`` -> cluster (the local provider's namespace names)."""
    return netns[3:].rsplit("-", 1)[0] if netns.startswith("ct-") else ""


def _bridge_cluster(bridge: str) -> str:
    """The cluster a local-provider bridge belongs to, from its alias ``clustertool:<cluster>:<token>[:…]``."""
    try:
        alias = Path("/sys/class/net", bridge, "ifalias").read_text().strip()
    except OSError:
        return ""
    parts = alias.split(":")
    return parts[1] if len(parts) >= 3 and parts[0] == "clustertool" else ""


def our_footprint() -> list[str]:
    """Namespaces, bridges and processes of the local provider that belong to this run's clusters."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in netns.splitlines() if line.strip()]
    left = [f"netns {n}" for n in names if ours(_netns_cluster(n))]
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    bridges = [line.split(":")[1].strip() for line in links.splitlines() if ":" in line]
    left += [f"bridge {b}" for b in bridges if ours(_bridge_cluster(b))]
    procs = subprocess.run(["pgrep", "-af", rf"clusters/[a-z][a-z0-9]*-{SESSION}[0-9a-f]{{4}}/"],
                           capture_output=True, text=True).stdout
    left += [f"process {line}" for line in procs.splitlines()]
    return left


def pytest_sessionfinish(session, exitstatus):
    """After the suite, nothing of the local provider that this run made may remain.

    Only this run's clusters count (their names carry SESSION): a cluster someone else runs on
    this machine at the same time is neither a leak nor a failure of this suite.  Under xdist the
    controller checks, once every worker has ended (a worker's exit status does not reach the run's).
    """
    if hasattr(session.config, "workerinput"):
        return
    left = our_footprint()
    if left:
        sys.stderr.write("\nLEAK: the test suite left local-provider resources behind:\n  "
                         + "\n  ".join(left) + "\n")
        session.exitstatus = 1


# ---- parallel workers (pytest-xdist, `make test`: -n N) -------------------------------------------------
# Tests run on any worker, one at a time each, unless they share something (tests/xdist_groups.py): a
# module's cluster, or native/'s build folder.  Each worker is its own process with its own session
# fixtures (the aws tier's moto server, which every test resets, is one per worker).


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # --dist each, loadfile, loadscope, worksteal: as asked
    from tests.xdist_groups import SharedFixtureScheduling

    return SharedFixtureScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """On a worker: slow tiers first, so unit tests fill the gaps at the end (every worker sorts alike)."""
    if hasattr(config, "workerinput"):
        from tests.xdist_groups import tier_rank

        items.sort(key=tier_rank)  # stable: within a tier, files and tests keep their order
