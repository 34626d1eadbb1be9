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
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Callable, Iterator, TypedDict

HANDLED = (signal.SIGTERM, signal.SIGHUP)


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


_STATE: _State = {"deferring": 0, "pending": None, "fired": False}


def _handler(signum: int, frame: FrameType | None) -> None:
    if _STATE["fired"] or _STATE["pending"] is not None:
        return  # the cleanup the first signal started keeps running
    if _STATE["deferring"]:
        _STATE["pending"] = signum
        return
    _STATE["fired"] = True
    raise Terminated(signum)


def install() -> Callable[[], None]:
    """Handle SIGTERM/SIGHUP in this (main) thread; returns a function restoring the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _STATE.update({"deferring": 0, "pending": None, "fired": False})
    # a signal the caller chose to ignore (`nohup` ignores SIGHUP) stays ignored
    old = {sig: signal.signal(sig, _handler) for sig in HANDLED if signal.getsignal(sig) is not signal.SIG_IGN}

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _STATE.update({"deferring": 0, "pending": None, "fired": False})
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
