"""Bounded time for every AWS call: per-attempt timeouts, a retry budget, and progress while retrying.

botocore's own retries are off (they are silent and, against a hung endpoint, multiply its
60 s read timeout by the attempt count).  Here each call is retried, below the test seam:

- an endpoint that refuses, drops or does not answer: up to ``CONNECT_ATTEMPTS`` attempts,
  each bounded by ``attempt_timeouts()``;
- throttling and HTTP 5xx answers: up to ``CLUSTERTOOL_AWS_MAX_ATTEMPTS`` attempts;

with exponential backoff, never past the budget (``CLUSTERTOOL_AWS_API_TIMEOUT``, default 60 s,
``clustertool --api-timeout S``), and a progress line per retry (``retrying DescribeInstances
(3/5) in 2.0s: ...``).  Once an endpoint has used up a budget without answering, further calls
to it in the same process fail at once (``up``'s rollback then says to run ``down`` later),
so one command never spends the budget twice.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Callable

from clustertool.core.errors import ProviderError
from clustertool.core.model import Reporter

CONNECT_ATTEMPTS = 5
THROTTLE_CODES = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
                  "RequestThrottled", "RequestThrottledException", "SlowDown"}
TRANSIENT_CODES = {"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete", "InternalError",
                   "InternalFailure", "ServiceUnavailable", "Unavailable"}
_DEAD: dict[str, tuple[float, str]] = {}  # endpoint -> (until, why): no answer within a whole budget


def budget() -> float:
    """Seconds one call may spend retrying an endpoint that does not answer (default 60)."""
    try:
        value = float(os.environ.get("CLUSTERTOOL_AWS_API_TIMEOUT") or 60.0)
    except ValueError:
        value = 60.0
    return max(1.0, value)


def attempt_timeouts(total: float | None = None) -> tuple[float, float]:
    """(connect, read) timeout of one attempt: a fifth of the budget, connect at most 5 s."""
    read = max(0.5, (budget() if total is None else total) / CONNECT_ATTEMPTS)
    return min(5.0, read), read


def throttle_attempts() -> int:
    try:
        return max(1, int(os.environ.get("CLUSTERTOOL_AWS_MAX_ATTEMPTS") or 10))
    except ValueError:
        return 10


def _backoff(attempt: int) -> float:
    """0.5, 1, 2, 4 ... s (capped at 8), with a little jitter so retries of many clients spread."""
    return min(8.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.8, 1.0)


def classify(exc: BaseException) -> str | None:
    """'connect' (no usable answer), 'throttle' or 'transient' (worth retrying), or None."""
    from botocore import exceptions as bx

    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):  # refused, reset, timeouts, closed
        return "connect"
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) \
            if isinstance(exc.response, dict) else 0
        if code in THROTTLE_CODES:
            return "throttle"
        if code.isdigit():  # a bare HTTP status, no AWS error body: an emulator lacking the API
            return None
        if code in TRANSIENT_CODES or (status >= 500 and code not in ("NotImplemented",)):
            return "transient"
    return None


def describe_failure(exc: BaseException) -> str:
    from botocore import exceptions as bx

    if isinstance(exc, bx.ReadTimeoutError):
        return "no answer (read timeout)"
    if isinstance(exc, bx.ConnectTimeoutError):
        return "no connection (connect timeout)"
    if isinstance(exc, bx.EndpointConnectionError):
        return "connection refused or no route"
    if isinstance(exc, bx.ConnectionClosedError):
        return "the connection was closed without an answer"
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {' '.join(str(error.get('Message', '')).split())[:120]}"
    return " ".join(str(exc).split())[:160]


def unreachable(endpoint: str, op: str, detail: str) -> ProviderError:
    return ProviderError(f"cannot reach AWS at {endpoint}: {op}: {detail}",
                         hint="check the network and AWS_ENDPOINT_URL; `clustertool --api-timeout 300 ...` "
                              "(or CLUSTERTOOL_AWS_API_TIMEOUT) waits longer")


def check_alive(endpoint: str, op: str) -> None:
    """Fail at once for an endpoint that already used up a budget in this process."""
    dead = _DEAD.get(endpoint)
    if dead and dead[0] > time.monotonic():
        raise unreachable(endpoint, op, f"gave no answer earlier in this command ({dead[1]})")


def run(call: Callable[[], Any], *, op: str, endpoint: str, report: Reporter) -> Any:
    """``call()`` with retries, within the budget; returns its answer or raises its last error."""
    check_alive(endpoint, op)
    total = budget()
    _, read = attempt_timeouts(total)
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised unless retryable
            kind = classify(exc)
            if kind is None:
                raise
            limit = CONNECT_ATTEMPTS if kind == "connect" else throttle_attempts()
            pause = _backoff(attempt)
            worst = read if kind == "connect" else 0.0
            elapsed = time.monotonic() - start
            if attempt >= limit or elapsed + pause + worst > total:
                if kind == "connect":
                    why = f"{describe_failure(exc)}; {attempt} attempt(s) over {elapsed:.0f}s"
                    _DEAD[endpoint] = (time.monotonic() + total, describe_failure(exc))
                    raise unreachable(endpoint, op, why) from None
                raise
            report(f"retrying {op} ({attempt + 1}/{limit}) in {pause:.1f}s: {describe_failure(exc)}")
            time.sleep(pause)
