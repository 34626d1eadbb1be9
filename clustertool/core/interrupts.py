"""SIGTERM and SIGHUP end a command the way Ctrl-C does: as an exception that the command's own
cleanup sees (``up`` rolls back, ``down`` stops after its current step).

They are what ``timeout``, CI cancellation, ``docker stop`` and a dropped SSH session send, so
dying on them without cleanup would leave paid resources behind.  The CLI installs the handler
(:func:`install`) for the length of one command (not for a signal the caller ignores, as
``nohup`` ignores SIGHUP); core code only raises, defers and checks.

Inside :func:`deferred` (``down``), a signal is remembered instead of raised, and
:func:`checkpoint` raises it at the next safe point (between two deletes), so a delete already
sent to the provider is seen through and the state on disk says what is left.  After the first
signal, further SIGTERM/SIGHUP are ignored so that the cleanup they started can finish.

A signal (Ctrl-C too) that comes while Python runs code whose exceptions it prints and drops (an at-fork hook, a
finalizer) is sent again a moment later instead of being raised there and lost.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from types import FrameType
from typing import Callable, Iterator, TypedDict

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """Ctrl-C, on its way out of a command (cli/app.py turns a command's KeyboardInterrupt into this): typer
    0.28 catches a KeyboardInterrupt itself and exits 130 without a word, where the user is owed a line."""


class Terminated(BaseException):
    """The process got SIGTERM or SIGHUP; exit status 128 + signal number.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in library code
    does not swallow it."""

    def __init__(self, signum: int, message: str | None = None, hint: str | None = None):
        self.signum = signum
        self.message = message or f"stopped by {signal_name(signum)}"
        self.hint = hint
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _State(TypedDict):
    deferring: int          # depth of nested deferred() blocks
    pending: int | None     # a signal that arrived while deferring
    fired: bool             # a signal was raised (later ones are ignored)
    again: int | None       # a signal sent again to the main thread until a handler raises it (_again_soon)


_STATE: _State = {"deferring": 0, "pending": None, "fired": False, "again": None}


# Python code where an exception is printed ("Exception ignored in ...") and lost: the hooks os.fork runs
# (logging's lock release after every fork, so after every subprocess started) and finalizers.
SWALLOWING = frozenset({"_releaseLock", "_acquireLock", "_after_at_fork_child_reinit_locks", "__del__"})
REDELIVER_S = 0.05


def _swallowed(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name in SWALLOWING:
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """The signal again and again, every REDELIVER_S, to the main thread, until a handler raises it (raised now,
    inside code that drops exceptions, it would be lost).  Once is not enough: a delivery that lands as the main
    thread is about to sleep in a system call (time.sleep, a wait) runs its handler only when that call ends."""
    if _STATE["again"] is not None:
        return  # the sender is already going
    _STATE["again"] = signum
    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: it is running this

    def send() -> None:
        while True:
            time.sleep(REDELIVER_S)
            if _STATE["again"] != signum:
                return
            signal.pthread_kill(main, signum)

    threading.Thread(target=send, name="signal-again", daemon=True).start()


def _raised() -> None:
    _STATE["again"] = None  # the signal is out: its sender stops


def _handler(signum: int, frame: FrameType | None) -> None:
    if _STATE["fired"] or _STATE["pending"] is not None:
        _raised()  # (a repeat of the one raised)
        return  # the cleanup the first signal started keeps running
    if _STATE["deferring"]:
        _STATE["pending"] = signum
        return
    if _swallowed(frame):
        _again_soon(signum)
        return
    _STATE["fired"] = True
    _raised()
    raise Terminated(signum)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, but never where it would be lost (a Ctrl-C
    that came as a step's subprocess was forked was printed and ignored, and the step ran on)."""
    if _swallowed(frame):
        _again_soon(signum)
        return
    _raised()
    raise KeyboardInterrupt


def install() -> Callable[[], None]:
    """Handle SIGTERM/SIGHUP (and SIGINT, where Python's own handler is in place) in this (main) thread; returns
    a function restoring the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _STATE.update({"deferring": 0, "pending": None, "fired": False, "again": None})
    # a signal the caller chose to ignore (`nohup` ignores SIGHUP) stays ignored
    old = {sig: signal.signal(sig, _handler) for sig in HANDLED if signal.getsignal(sig) is not signal.SIG_IGN}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)

    def restore() -> None:
        _raised()  # no signal sent again past the command, to handlers that are not ours
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _STATE.update({"deferring": 0, "pending": None, "fired": False, "again": None})
    return restore


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Signals arriving inside the block wait for the next :func:`checkpoint` (or the block's end)."""
    _STATE["deferring"] += 1
    try:
        yield
    finally:
        _STATE["deferring"] -= 1
    checkpoint()


def checkpoint() -> None:
    """Raise a signal that arrived while deferred; a no-op otherwise."""
    signum = _STATE["pending"]
    if signum is not None:
        _STATE["pending"] = None
        _STATE["fired"] = True
        raise Terminated(signum)
