"""The recovery controller as a detached process on this machine: this module starts, finds and stops it for
`up`, `status`, `down` and `down --sweep`; its body is controller/process.py's ``serve``, a layer above.

:func:`start` runs ``python -m clustertool.controller.daemon run NAME`` in a session of its own (setsid: it
outlives the command that started it, and no terminal's hangup reaches it), its output appended to
``controller.log`` in the cluster's folder.  The process holds an exclusive ``flock`` on ``controller.lock``
there for its whole life and writes ``controller.pid`` once it holds it: a second controller of the cluster
cannot take the lock and exits, so there are never two, whoever starts them and however at once.
:func:`running` asks the lock, not the pid file, so a crashed controller never counts as running.
:func:`stop` sends SIGTERM (the loop ends after its round), waits for the lock to be free, and SIGKILLs only
a controller that does not end in time.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import ToolError

ALREADY = 3  # the exit code of a controller that found another one holding the lock
START_TIMEOUT_S = 60.0  # a loaded machine takes seconds to import the program


@dataclass(frozen=True)
class Files:
    root: Path

    @property
    def lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def pid(self) -> Path:
        return self.root / "controller.pid"

    @property
    def log(self) -> Path:
        return self.root / "controller.log"

    @property
    def status(self) -> Path:
        return self.root / "controller.json"


def files(name: str) -> Files:
    return Files(state.cluster_dir(name))


@dataclass(frozen=True)
class Started:
    pid: int
    log: str
    already: bool  # one was running: it was kept, none was started


@dataclass(frozen=True)
class Stopped:
    pid: int | None
    how: str  # "not running", "stopped" (SIGTERM), "killed" (SIGKILL after the grace)


def argv(name: str, poll: float) -> list[str]:
    """The controller's command line (the cluster's log path in it: leak checks find it by its folder)."""
    return [sys.executable, "-m", "clustertool.controller.daemon", "run", name, "--poll", f"{poll:g}",
            "--log", str(files(name).log)]


def running(name: str) -> int | None:
    """The pid of the cluster's controller while one holds the lock; None otherwise."""
    f = files(name)
    try:
        fd = os.open(f.lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it exclusively: no controller
    except BlockingIOError:
        return _pid_of(f) or 0  # held; 0: its pid file is not written yet
    finally:
        os.close(fd)


def _pid_of(f: Files) -> int | None:
    try:
        return int(f.pid.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start(session: ClusterSession, poll: float = 2.0, timeout: float = START_TIMEOUT_S) -> Started:
    """The cluster's controller, detached; the one already running is kept (``already``)."""
    f = files(session.name)
    f.root.mkdir(parents=True, exist_ok=True)
    pid = running(session.name)
    if pid:
        return Started(pid, str(f.log), True)
    fd = os.open(f.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        child = subprocess.Popen(argv(session.name, poll), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                 start_new_session=True, close_fds=True, cwd=str(f.root))
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            pid = _wait_for_pid(session.name) if child.returncode == ALREADY else None
            if pid:
                return Started(pid, str(f.log), True)  # another start won the lock a moment earlier
            raise ToolError(f"the controller of {session.name!r} did not start: {_tail(f.log)}",
                            hint=f"see {f.log}")
        if _pid_of(f) == child.pid and running(session.name) == child.pid:
            return Started(child.pid, str(f.log), False)
        time.sleep(0.05)
    child.kill()
    child.wait()
    raise ToolError(f"the controller of {session.name!r} did not start within {timeout:.0f}s", hint=f"see {f.log}")


def _tail(path: Path, lines: int = 3) -> str:
    try:
        found = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return " / ".join(found[-lines:]) or "no output"


def stop(session: ClusterSession | str, timeout: float = 20.0) -> Stopped:
    """End the cluster's controller (`down` calls this first); nothing is left running."""
    name = session if isinstance(session, str) else session.name
    pid = _wait_for_pid(name)
    if pid is None:
        return Stopped(None, "not running")
    if not _is_controller(pid, name):
        raise ToolError(f"the process holding {files(name).lock} (pid {pid}) is not this cluster's controller",
                        hint="look at it with `ps`; clustertool signals only its own controller")
    os.kill(pid, signal.SIGTERM)
    if _gone(name, pid, timeout):
        return Stopped(pid, "stopped")
    os.kill(pid, signal.SIGKILL)
    _gone(name, pid, 10.0)
    return Stopped(pid, "killed")


def strays() -> list[tuple[int, str]]:
    """(pid, cluster) of this home's controllers whose cluster state is gone (`down --sweep` stops them; each also
    ends by itself at its next round)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if "clustertool.controller.daemon" not in words or "run" not in words or "--log" not in words:
            continue
        at = words.index("run") + 1
        name, log = (words[at] if at < len(words) else ""), words[words.index("--log") + 1:][:1]
        if name and log == [str(files(name).log)] and not state.exists(name) and _alive(int(pid)):
            found.append((int(pid), name))
    return found


def stop_strays(timeout: float = 20.0) -> list[str]:
    """SIGTERM this home's controllers whose cluster state is gone, SIGKILL what is left after ``timeout``."""
    lines = []
    for pid, name in strays():
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        how = "stopped"
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            how = "killed"
        lines.append(f"{name}: {how} its controller (pid {pid}), whose cluster state is gone")
    return lines


def _wait_for_pid(name: str, wait_s: float = 5.0) -> int | None:
    """The running controller's pid (a controller that just took the lock writes its pid file next)."""
    deadline = time.monotonic() + wait_s
    while True:
        pid = running(name)
        if pid != 0 or time.monotonic() > deadline:
            return pid or None
        time.sleep(0.05)


def _is_controller(pid: int, name: str) -> bool:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"clustertool.controller.daemon" in words and name.encode() in words


def _gone(name: str, pid: int, timeout: float) -> bool:
    """Whether the controller ended (its lock free) within ``timeout``; reaps it when it is our child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if running(name) is None and not _alive(pid):  # the lock goes with its files, a moment before the process
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    """Still running (a zombie, whose parent has not reaped it yet, has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def status_line(name: str) -> str | None:
    """`status`'s controller line (phase B renders it): running or not, and what its last round saw; None for a
    cluster that never had a controller here."""
    f = files(name)
    try:
        seen = json.loads(f.status.read_text())
    except (OSError, ValueError):
        seen = None
    pid = running(name)
    if seen is None and not pid:
        return None
    if not pid:
        return "not running (`up --controller` starts it)"
    if not seen or not seen.get("rounds"):
        return f"running (pid {pid}), no round yet"
    look = time.strftime("%H:%M:%S", time.localtime(seen.get("at") or 0))
    if not seen.get("leader_answers", True):
        return f"running (pid {pid}); the leader {seen.get('leader')} did not answer {seen.get('misses')} round(s)"
    waits = [w for w in seen.get("waiting") or [] if not (w.get("claimed") or w.get("replaced") or w.get("killed"))]
    what = ", ".join(f"{w['job']} waits for {','.join(w['nodes'])}" for w in waits) or "no job waits"
    return f"running (pid {pid}), last look at {seen.get('leader')} {look}: {what}"
