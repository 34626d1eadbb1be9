"""The controller's process body: ``serve`` runs the loop (controller/loop.py) under the cluster's lock, with the
handlers that replace lost nodes and a lost leader.  Starting, finding and stopping it is
cluster/controllerproc.py's (re-exported here), below the commands that use it (`up`, `status`, `down`)."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import threading
import time
from typing import Callable

from clustertool.cluster.controllerproc import (
    ALREADY,
    Files,
    Started,
    Stopped,
    _alive,
    _pid_of,
    argv,
    files,
    running,
    start,
    status_line,
    stop,
    stop_strays,
    strays,
)
from clustertool.cluster.session import ClusterSession
from clustertool.controller.loop import Loop, relauncher, replacer
from clustertool.core.errors import ToolError

__all__ = ["ALREADY", "Files", "Started", "Stopped", "_alive", "argv", "by", "files", "running", "serve", "start",
           "status_line", "stop", "stop_strays", "strays"]


def serve(name: str, poll: float) -> int:
    """The detached process itself: hold the lock, write the pid file, run the loop until SIGTERM."""
    f = files(name)
    fd = os.open(f.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"{_now()} another controller of {name} is running (pid {_pid_of(f)}): this one ends", flush=True)
        return ALREADY
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tmp = f.pid.with_name(f.pid.name + ".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, f.pid)
    say = _sayer()
    say(f"controller of {name} started (pid {os.getpid()}, a round every {poll:g}s)")
    try:
        Loop(ClusterSession.load(name, report=say), handle=replacer(by()), report=say, status_path=f.status,
             on_leader_lost=relauncher).run(stop, poll)
    except ToolError as exc:  # the cluster is gone (its state removed): nothing left to watch
        say(f"controller of {name} ends: {exc.message}")
        return 1
    finally:
        f.pid.unlink(missing_ok=True)
    say(f"controller of {name} stopped")
    return 0


def by() -> str:
    """How `jobs` names this controller as the replacer of a node."""
    return f"the controller on {socket.gethostname() or 'this machine'}"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _sayer() -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"{_now()} {line}", flush=True)
    return say


