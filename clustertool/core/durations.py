"""Durations as users write them (``30m``, ``1h``, ``1h30m``, ``90s``; a bare number is minutes):
--autostop, --hang-timeout, up --retry-interval / --retry-for."""

from __future__ import annotations

import re

from clustertool.core.errors import UsageError

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str, what: str = "idle time") -> int:
    """Seconds in ``30m``, ``1h``, ``1h30m``, ``90s`` or a bare number of minutes (``what``: for errors)."""
    value = str(text).strip().lower()
    if value.isdigit():
        seconds = int(value) * 60
    else:
        match = _DURATION.match(value)
        if not value or not match:
            raise UsageError(f"invalid {what} {text!r}", hint="write it as 30m, 1h, 1h30m or 90s")
        h, m, s = (int(g or 0) for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    if seconds < 1:
        raise UsageError(f"invalid {what} {text!r}: it must be at least one second")
    return seconds


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h}h" if h else "", f"{m}m" if m else "", f"{s}s" if s or not (h or m) else ""]
    return "".join(parts)


def short_age(seconds: float) -> str:
    """``42m`` under an hour, else ``3.5h``: a cluster's age in a table."""
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    return f"{seconds / 3600:.1f}h"
