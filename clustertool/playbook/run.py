"""Running a checked playbook: each step as its own `python -m clustertool` process.

Why a process per step rather than calling ``clustertool.cli.app.run(argv)`` in-process:
a step then behaves exactly as the same command typed by the user; it starts with fresh
module state (click objects, the local provider's table of launched nodes, signal
handlers); a step that hangs past its ``timeout:`` or crashes can be interrupted or killed
while the runner lives on to run the ``always:`` steps; and Ctrl-C (SIGINT) or SIGTERM
reach the step, which cleans up as it would on its own, before the runner tears down.
The cost is ~0.3 s of interpreter start per step, small next to any step's work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Callable, Iterator, TextIO

from clustertool.core import state
from clustertool.core.errors import ExitStatus
from clustertool.playbook.load import Playbook, Step

GRACE = 60.0  # seconds a step gets to clean up after Ctrl-C / timeout before it is killed


@dataclass
class Outcome:
    label: str
    name: str
    section: str
    command: str
    status: str = "not run"   # ok | failed | ignored | skipped | interrupted | not run
    exit_code: int | None = None
    seconds: float = 0.0
    reason: str = ""


@dataclass
class PlayResult:
    playbook: str
    outcomes: list[Outcome] = field(default_factory=list)
    failed_step: str | None = None
    reason: str = ""
    interrupted: bool = False
    kept_cluster: str | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return ExitStatus.INTERRUPTED
        if self.failed_step:
            return ExitStatus.FAILURE
        always_failed = any(o.status == "failed" for o in self.outcomes if o.section == "always")
        return ExitStatus.FAILURE if always_failed else ExitStatus.OK


Event = Callable[[str, Step, Outcome], None]  # ("start" | "end", step, outcome)


def step_process_argv(step: Step) -> list[str]:
    return [sys.executable, "-m", "clustertool", *step.argv]


class _Interrupt(Exception):
    pass


def _run_process(argv: list[str], timeout: float | None, out: TextIO | None,
                 err: Callable[[str], None]) -> tuple[int | None, str, str]:
    """(exit code, last stderr line, why it stopped early or "").  Raises _Interrupt on Ctrl-C."""
    # Its own process group, so a signal reaches the step and whatever it started (and not us);
    # SIGINT back to default, as a playbook started in the background inherits it ignored.
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_default_sigint)
    stderr = proc.stderr
    assert stderr is not None  # PIPE
    tail: list[str] = []

    def pump() -> None:
        for raw in iter(stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            err(line)
            if line.strip():
                tail[:] = (tail + [line.strip()])[-5:]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    code: int | None
    try:
        code = proc.wait(timeout=timeout)
        why = ""
    except subprocess.TimeoutExpired:
        code, why = _stop(proc), f"timed out after {timeout:g}s"
    except KeyboardInterrupt:
        _stop(proc)
        reader.join(timeout=5)
        raise _Interrupt(_last_error(tail)) from None
    reader.join(timeout=5)
    return code, _last_error(tail), why


def _last_error(tail: list[str]) -> str:
    errors = [line for line in tail if line.startswith("error:")]
    return (errors or tail or [""])[-1]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen) -> int | None:
    """Ctrl-C the step (it cleans up like it would for the user), then kill it after GRACE."""
    for sig, wait in ((signal.SIGINT, GRACE), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            code = proc.wait(timeout=wait)
            if sig == signal.SIGINT:  # what the step left behind in its group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            return code
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting for the clean up
            continue
    return proc.poll()


def run(book: Playbook, *, on_event: Event = lambda *a: None, step_stdout: TextIO | None = None,
        step_stderr: Callable[[str], None] = lambda line: None,
        notify: Callable[[str], None] = lambda m: None) -> PlayResult:
    """Run the steps in order, stopping at the first failure; then the always: steps.

    Each step's stdout goes to ``step_stdout`` (None: inherited); its stderr lines are handed
    to ``step_stderr`` as they come (and their tail kept for the failure reason).
    """
    result = PlayResult(book.name)
    t0 = time.monotonic()
    keep = False
    with _signal(signal.SIGTERM, _sigterm_as_interrupt):
        try:
            for step in book.steps:
                outcome = _one(step, on_event, step_stdout, step_stderr)
                result.outcomes.append(outcome)
                if outcome.status == "interrupted":
                    result.interrupted, result.failed_step, result.reason = True, step.label, "interrupted"
                    break
                if outcome.status == "failed":
                    result.failed_step, result.reason = step.label, outcome.reason
                    keep = step.on_failure == "keep"
                    break
        except KeyboardInterrupt:  # between steps
            result.interrupted, result.reason = True, "interrupted"
            result.failed_step = result.failed_step or "between steps"
    done = {o.label for o in result.outcomes}
    result.outcomes += [_outcome(s) for s in book.steps if s.label not in done]
    presses = [0]

    def second_press(signum: int, frame: FrameType | None) -> None:
        presses[0] += 1
        if presses[0] >= 2:
            raise KeyboardInterrupt
        notify("always: steps are cleaning up; press Ctrl-C again to abandon them")

    with _signal(signal.SIGINT, second_press):
        try:
            _always(book, result, keep, on_event, step_stdout, step_stderr)
        except KeyboardInterrupt:
            result.interrupted, result.reason = True, "interrupted during always: steps"
    result.seconds = time.monotonic() - t0
    return result


Handler = Callable[[int, FrameType | None], None]  # a Python-level signal handler

@contextlib.contextmanager
def _signal(signum: int, handler: Handler) -> Iterator[None]:
    """Install a signal handler for a block (only possible in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _always(book: Playbook, result: PlayResult, keep: bool, on_event: Event, out: TextIO | None,
            err: Callable[[str], None]) -> None:
    steps = list(book.always)
    if keep:
        result.kept_cluster = book.cluster
        for step in [s for s in steps if s.command == ("down",)]:
            skipped = _outcome(step, "skipped", "on_failure: keep")
            result.outcomes.append(skipped)
            on_event("end", step, skipped)
        steps = [s for s in steps if s.command != ("down",)]
    elif result.failed_step and book.cluster and not any(s.command == ("down",) for s in steps):
        if state.exists(book.cluster):
            steps.append(Step("always", len(steps) + 1, ("down",), {}, "down (on failure)",
                              argv=["down", "-c", book.cluster, "--yes"]))
    for step in steps:
        outcome = _one(step, on_event, out, err)
        result.outcomes.append(outcome)
        if outcome.status == "interrupted":  # Ctrl-C twice: abandon the rest
            result.interrupted = True
            break


def _outcome(step: Step, status: str = "not run", reason: str = "") -> Outcome:
    return Outcome(step.label, step.name, step.section, step.display, status, reason=reason)


def _one(step: Step, on_event: Event, out: TextIO | None, err: Callable[[str], None]) -> Outcome:
    outcome = _outcome(step)
    if not step.run:
        when = str(step.when).lower() if isinstance(step.when, bool) else step.when
        outcome.status, outcome.reason = "skipped", f"when: {when}"
        on_event("end", step, outcome)
        return outcome
    on_event("start", step, outcome)
    t0 = time.monotonic()
    try:
        code, last, why = _run_process(step_process_argv(step), step.timeout, out, err)
    except _Interrupt as exc:
        outcome.status, outcome.reason = "interrupted", str(exc) or "interrupted (Ctrl-C)"
    else:
        outcome.exit_code = code
        if code == 0 and not why:
            outcome.status = "ok"
        else:
            outcome.reason = why or last or f"exit {code}"
            outcome.status = "ignored" if step.on_failure == "continue" and step.section == "steps" else "failed"
    outcome.seconds = time.monotonic() - t0
    on_event("end", step, outcome)
    return outcome
