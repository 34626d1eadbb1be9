"""System side of the local provider: run argv lists, the global lock, namespaces, processes.

Kept apart from ``__init__.py`` (the provider verbs) and ``net.py`` (pure builders).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from clustertool.core.errors import ProviderError
from clustertool.core.state import flocked
from clustertool.providers.local import net

LOCK_PATH = Path("/run/lock/clustertool-local.lock")
SCRATCH = Path("/scratch")
SCRATCH_MARKER = Path("/run/lock/clustertool-local.scratch-created")
NETNS_DIR = Path("/run/netns")


def run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command, capture output; on failure raise a one-line ProviderError."""
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise ProviderError(f"{argv[0]} not found", hint="apt-get install iproute2 openssh-server") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProviderError(f"`{' '.join(argv[:4])}` failed: {detail}")
    return proc


def run_batch(argv: list[str], lines: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return run(argv, stdin="\n".join(lines) + "\n", check=check)


def run_parallel(jobs: Sequence[tuple[list[str], str | None]]) -> list[subprocess.CompletedProcess]:
    """Start every (argv, stdin) at once, then collect; raise on the first failure."""
    procs = []
    for argv, stdin in jobs:
        procs.append((argv, subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results, failure = [], None
    for (argv, proc), (_, stdin) in zip(procs, jobs):
        out, err = proc.communicate(stdin, timeout=120)
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        results.append(result)
        if proc.returncode != 0 and failure is None:
            failure = result
    if failure is not None:
        detail = (failure.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProviderError(f"`{' '.join(failure.args[:4])}` failed: {detail}")
    return results


def global_lock(timeout: float = 60.0) -> contextlib.AbstractContextManager[None]:
    """System-wide lock for slot allocation, the shared route and /scratch (all CLUSTERTOOL_HOMEs)."""
    busy = ProviderError(f"timed out waiting for {LOCK_PATH}",
                         hint="another local cluster is being made or removed")
    return flocked(LOCK_PATH, timeout, busy)


def bridge_names() -> list[str]:
    out = run(net.bridges_argv()).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_list() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def route_present() -> bool:
    return bool(run(net.route_show_argv(), check=False).stdout.strip())


def _netns_inodes(names: Iterable[str]) -> dict[int, str]:
    inodes = {}
    for name in names:
        with contextlib.suppress(OSError):
            inodes[os.stat(NETNS_DIR / name).st_ino] = name
    return inodes


def pids_in_netns(names: Iterable[str]) -> dict[str, list[int]]:
    """Live pids per namespace, from one scan of /proc (like `ip netns pids`, for many at once)."""
    inodes = _netns_inodes(names)
    found: dict[str, list[int]] = {name: [] for name in inodes.values()}
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            link = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        ino = int(link[link.index("[") + 1:-1])
        if ino in inodes:
            found[inodes[ino]].append(int(entry))
    return found


def pids_starting_nodes_of(nodes_dir: Path | str) -> list[int]:
    """Live pids whose argv names a node config under ``nodes_dir`` (``.../node-N/init.json``): a
    node's launcher and its init, also while they are between namespaces (not yet, or no longer,
    in the node's netns) -- what a scan by netns alone can miss right after a start."""
    prefix = os.fsencode(str(nodes_dir).rstrip("/") + "/")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(prefix) and a[len(prefix):].count(b"/") == 1 and a.endswith(b"/init.json")
               for a in args):
            found.append(int(entry))
    return found


def accepts(address: str, port: int) -> bool:
    """Whether ``address:port`` takes a TCP connection now."""
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


def comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """True for a running process (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def kill_all(pids: Iterable[int], timeout: float = 5.0, reap: Callable[[], object] = lambda: None) -> list[int]:
    """SIGKILL each pid, then wait until all are gone; return those that were killed."""
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        reap()
        time.sleep(0.01)
    reap()
    return killed


def ensure_scratch() -> None:
    """/scratch must exist as a mount point; make it (and remember that we did) if missing."""
    if SCRATCH.exists():
        return
    SCRATCH.mkdir(mode=0o755)
    SCRATCH_MARKER.write_text("clustertool's local provider created /scratch\n")


def release_scratch() -> str | None:
    """At the last local cluster's end: remove /scratch if we made it and it is empty."""
    if not SCRATCH_MARKER.exists():
        return None
    try:
        SCRATCH.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return None  # someone put something there: keep it, and keep the marker
    SCRATCH_MARKER.unlink(missing_ok=True)
    return "removed /scratch (made for local nodes)"


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"
