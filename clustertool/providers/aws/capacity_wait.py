"""``up --retry-until-up``: when no zone has capacity for the whole cluster, wait and try again.

Each attempt is one round over the zones in order, each zone all or nothing as without the flag
(az_launch.launch_in_order; a failed zone leaves nothing).  Between rounds the `up` sleeps the
interval in short steps: Ctrl-C or SIGTERM/SIGHUP interrupts the sleep at once and `up` rolls
back as always, and each step refreshes the up's lease so a sweep never mistakes a waiting `up`
for a dead one.  While it waits, the state says so (``provider_state["capacity_wait"]``), which
`status` and `ls` show.  Only capacity errors are waited out: a quota error does not go away by
itself, so it fails the `up` at once, as without the flag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from clustertool.core.durations import format_duration, parse_duration
from clustertool.core.errors import ProviderError, UsageError

DEFAULT_INTERVAL = "5m"
DEFAULT_FOR = "6h"
KEY = "capacity_wait"  # provider_state key while an `up` waits or retries
ATTEMPTS = "launch_attempts"  # provider_state key: how many rounds the launch took


@dataclass
class Retry:
    interval_s: int
    for_s: int

    def describe(self) -> str:
        return f"every {format_duration(self.interval_s)} for at most {format_duration(self.for_s)}"


def setting(options: dict) -> Retry | None:
    """The retry setting of ``options``; None without --retry-until-up.  Bad values: one line."""
    interval, limit = options.get("retry_interval"), options.get("retry_for")
    if not options.get("retry_until_up"):
        if interval is not None or limit is not None:
            flag = "--retry-interval" if interval is not None else "--retry-for"
            raise UsageError(f"{flag}: only means something with --retry-until-up",
                             hint="add --retry-until-up, or drop the flag")
        return None
    if options.get("adopt_tag") or options.get("adopt_ids"):
        raise UsageError("--retry-until-up: adopting launches nothing, so there is no capacity to wait for")
    interval_s = parse_duration(str(interval or DEFAULT_INTERVAL), "--retry-interval")
    for_s = parse_duration(str(limit or DEFAULT_FOR), "--retry-for")
    if for_s < interval_s:
        raise UsageError(f"--retry-for {format_duration(for_s)} is shorter than --retry-interval "
                         f"{format_duration(interval_s)}: no second attempt would ever start",
                         hint="give a --retry-for of at least one interval")
    return Retry(interval_s, for_s)


def clock(epoch: float, fine: bool) -> str:
    """Local wall-clock time: HH:MM, or HH:MM:SS for short intervals."""
    return time.strftime("%H:%M:%S" if fine else "%H:%M", time.localtime(epoch))


def plan_line(retry: Retry) -> str:
    return (f"if no zone has capacity: try every zone again {retry.describe()} (one all-or-nothing attempt per "
            "zone each time; Ctrl-C stops the wait and removes what was made)")


def waiting_line(wait: dict, now: float | None = None, short: bool = False) -> str:
    """What `status` (and, ``short``, `ls`) say about an `up` that waits for capacity (``wait``: the
    state's record)."""
    now = time.time() if now is None else now
    fine = int(wait.get("interval_s") or 0) < 120
    attempt = int(wait.get("attempt") or 0)
    trying = wait.get("phase") == "trying" or float(wait.get("next_try") or 0) <= now
    if short:
        return (f"waiting for capacity (attempt {attempt + 1} under way)" if trying else
                f"waiting for capacity (attempt {attempt}, next try at {clock(wait['next_try'], fine)})")
    if trying:
        return f"waiting for capacity: attempt {attempt + 1} under way (giving up at {clock(wait['until'], fine)})"
    return (f"waiting for capacity: attempt {attempt} found none; next try at {clock(wait['next_try'], fine)} "
            f"(giving up at {clock(wait['until'], fine)})")


class Waiter:
    """The rounds of one `up`: records each in the state, sleeps between them, gives up after --retry-for."""

    def __init__(self, retry: Retry | None, state: dict, save: Callable[[], None],
                 report: Callable[[str], None], tick: Callable[[], None] | None = None):
        self.retry, self.state, self.save, self.report, self.tick = retry, state, save, report, tick
        self.started = time.time()
        self.attempt = 0

    @property
    def until(self) -> float:
        return self.started + (self.retry.for_s if self.retry else 0)

    def begin(self) -> int:
        """A round starts: its number (1, 2, ...)."""
        self.attempt += 1
        if self.retry is not None and self.attempt > 1:
            self.state[KEY] = {"attempt": self.attempt - 1, "phase": "trying", "until": self.until,
                               "interval_s": self.retry.interval_s}
            self.save()
        return self.attempt

    def succeeded(self) -> None:
        if self.retry is not None:
            self.state.pop(KEY, None)
            self.state[ATTEMPTS] = self.attempt

    def after_failure(self, failure: ProviderError, zones: list[str], itype: str, retryable: bool) -> None:
        """A round found no capacity: sleep until the next round, or raise ``failure`` (with the count)."""
        if self.retry is None:
            raise failure
        if not retryable:
            self.state.pop(KEY, None)
            raise failure
        next_try = time.time() + self.retry.interval_s
        fine = self.retry.interval_s < 120
        if next_try > self.until:
            self.state.pop(KEY, None)
            spent = format_duration(time.time() - self.started)
            raise ProviderError(f"{failure.message}; gave up after {self.attempt} attempt(s) in {spent} "
                                f"(--retry-for {format_duration(self.retry.for_s)})", hint=failure.hint)
        self.state[KEY] = {"attempt": self.attempt, "phase": "waiting", "next_try": next_try, "until": self.until,
                           "interval_s": self.retry.interval_s, "zones": zones, "instance_type": itype}
        self.save()
        self.report(f"attempt {self.attempt}: no {itype} capacity in {', '.join(zones)}; next try at "
                    f"{clock(next_try, fine)} (waiting until {clock(self.until, fine)} at most)")
        self._sleep_until(next_try)

    def _sleep_until(self, when: float) -> None:
        """Short sleeps: a signal's handler raises inside one at once; each step keeps the lease alive."""
        while True:
            left = when - time.time()
            if left <= 0:
                return
            time.sleep(min(left, 15.0))
            if self.tick is not None:
                self.tick()
