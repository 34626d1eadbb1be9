"""SIGTERM/SIGHUP become an exception (deferred in `down`), AWS calls retry within a budget with
progress lines, and the cluster lock names who holds it (no AWS, no moto)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from clustertool.core import interrupts, state
from clustertool.core.errors import ProviderError, StateError
from clustertool.providers.aws import retry

pytestmark = pytest.mark.unit


def test_sigterm_raises_terminated_with_exit_code_143_and_a_second_signal_is_ignored():
    restore = interrupts.install()
    try:
        with pytest.raises(interrupts.Terminated) as err:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert err.value.exit_code == 143 and "SIGTERM" in err.value.message
        os.kill(os.getpid(), signal.SIGHUP)  # during the cleanup: ignored, not raised
        time.sleep(0.05)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is not interrupts._handler


def test_a_signal_inside_deferred_waits_for_the_next_checkpoint():
    restore = interrupts.install()
    steps = []
    try:
        with pytest.raises(interrupts.Terminated) as err:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.05)
                steps.append("the delete in progress finished")
                interrupts.checkpoint()
                steps.append("never")
        assert err.value.exit_code == 129
    finally:
        restore()
    assert steps == ["the delete in progress finished"]


def _connection_refused():
    from botocore.exceptions import EndpointConnectionError

    return EndpointConnectionError(endpoint_url="http://127.0.0.1:9")


def test_a_refusing_endpoint_is_retried_with_progress_then_one_clear_error(monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_AWS_API_TIMEOUT", "60")
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    monkeypatch.setattr(retry, "_DEAD", {})
    lines, calls = [], []

    def call():
        calls.append(1)
        raise _connection_refused()

    with pytest.raises(ProviderError) as err:
        retry.run(call, op="DescribeInstances", endpoint="http://x", report=lines.append)
    assert len(calls) == retry.CONNECT_ATTEMPTS
    assert lines[1].startswith("retrying DescribeInstances (3/5) in ") and "connection refused" in lines[1]
    assert err.value.message.startswith("cannot reach AWS at http://x: DescribeInstances: connection refused")
    with pytest.raises(ProviderError, match="gave no answer earlier in this command"):
        retry.run(lambda: 1 / 0, op="DescribeVpcs", endpoint="http://x", report=lines.append)


def test_the_budget_bounds_the_retries_of_a_hung_endpoint(monkeypatch):
    from botocore.exceptions import ReadTimeoutError

    monkeypatch.setenv("CLUSTERTOOL_AWS_API_TIMEOUT", "10")
    monkeypatch.setattr(retry, "_DEAD", {})
    assert retry.attempt_timeouts() == (2.0, 2.0)
    clock = {"t": 0.0}
    monkeypatch.setattr(retry.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(retry.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))

    def hangs():
        clock["t"] += 2.0  # each attempt waits its whole read timeout
        raise ReadTimeoutError(endpoint_url="http://h")

    with pytest.raises(ProviderError, match="no answer"):
        retry.run(hangs, op="DescribeInstances", endpoint="http://h", report=lambda line: None)
    assert clock["t"] <= 10.0


def test_throttling_is_retried_and_an_answer_ends_it(monkeypatch):
    from botocore.exceptions import ClientError

    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    answers = [ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "RunInstances")] * 2
    lines = []

    def call():
        if answers:
            raise answers.pop()
        return "ok"

    assert retry.run(call, op="RunInstances", endpoint="http://t", report=lines.append) == "ok"
    assert len(lines) == 2 and "RequestLimitExceeded" in lines[0]


def test_an_http_500_without_an_aws_error_is_not_retried():
    from botocore.exceptions import ClientError

    bare = ClientError({"Error": {"Code": "500", "Message": "<html>"}, "ResponseMetadata": {"HTTPStatusCode": 500}},
                       "X")
    internal = ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "X")
    assert retry.classify(bare) is None and retry.classify(internal) == "transient"


def _hold(home, name, purpose, ready, release):
    os.environ["CLUSTERTOOL_HOME"] = home
    with state.locked(name, purpose=purpose):
        ready.set()
        release.wait(120)  # a safety: the test releases it


def test_the_lock_says_who_holds_it_and_an_up_is_refused_at_once(ct_env):
    """The waiter may wait 600 s, the `up` holds the lock until the test releases it (120 s at most): a
    waiter that waited instead of refusing would get the lock when the holder lets go and raise nothing.
    Refused while the `up` still holds the lock is the event asserted, not seconds."""
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    proc = multiprocessing.Process(target=_hold, args=(os.environ["CLUSTERTOOL_HOME"], "alpha", "up", ready, release))
    proc.start()
    try:
        assert ready.wait(60)
        assert state.holder("alpha") == (proc.pid, "up")
        with pytest.raises(StateError, match=f"'alpha' is being created by pid {proc.pid}"):
            with state.locked("alpha", timeout=600):
                pass
        assert not release.is_set() and proc.is_alive() and state.holder("alpha") == (proc.pid, "up")
    finally:
        release.set()
        proc.join(60)
    assert state.holder("alpha") is None


def test_a_lock_file_removed_while_waited_on_is_not_trusted(ct_env):
    """`down` deletes the lock file when it forgets a cluster; a waiter must lock the new file."""
    path = state.lock_path("alpha")
    path.parent.mkdir(parents=True, exist_ok=True)
    with state.locked("alpha"):
        path.unlink()
        with state.locked("alpha", timeout=1):  # a new file: free
            assert path.exists()


def test_the_home_id_is_made_once(ct_env):
    first = state.home_id()
    assert len(first) == 12 and state.home_id() == first


def test_a_signal_the_caller_ignores_stays_ignored():
    """`nohup clustertool up ...`: a hangup must not roll the cluster back."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        restore = interrupts.install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is interrupts._handler
        restore()
    finally:
        signal.signal(signal.SIGHUP, old)
