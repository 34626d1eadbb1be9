"""`up --retry-until-up`'s setting and what `status`/`ls` say while it waits (pure parts)."""

from __future__ import annotations

import pytest

from clustertool.core.errors import UsageError
from clustertool.providers.aws import capacity_wait

pytestmark = pytest.mark.unit


def test_defaults_are_five_minutes_for_six_hours_and_no_flag_means_no_wait():
    assert capacity_wait.setting({}) is None
    retry = capacity_wait.setting({"retry_until_up": True})
    assert (retry.interval_s, retry.for_s) == (300, 6 * 3600)
    assert retry.describe() == "every 5m for at most 6h"
    assert capacity_wait.setting({"retry_until_up": True, "retry_interval": "90s", "retry_for": "1h30m"}) == \
        capacity_wait.Retry(90, 5400)


def test_adopting_launches_nothing_so_there_is_nothing_to_wait_for():
    with pytest.raises(UsageError, match="adopting launches nothing"):
        capacity_wait.setting({"retry_until_up": True, "adopt_ids": "i-0abc"})


def test_the_waiting_line_says_the_attempt_the_next_try_and_the_end():
    now = 1_000_000.0
    wait = {"attempt": 2, "phase": "waiting", "next_try": now + 300, "until": now + 3600, "interval_s": 300}
    line = capacity_wait.waiting_line(wait, now=now)
    assert line.startswith("waiting for capacity: attempt 2 found none; next try at ")
    assert f"(giving up at {capacity_wait.clock(now + 3600, False)})" in line
    trying = capacity_wait.waiting_line({**wait, "phase": "trying"}, now=now)
    assert trying.startswith("waiting for capacity: attempt 3 under way")
    short = capacity_wait.waiting_line(wait, now=now, short=True)
    assert short == f"waiting for capacity (attempt 2, next try at {capacity_wait.clock(now + 300, False)})"
