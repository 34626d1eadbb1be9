"""`up --retry-until-up`: no zone has capacity, so `up` waits and tries every zone again.

Capacity errors are injected (moto never runs out): at the client seam for the in-process runs,
by the loopback proxy (tests/aws/faultproxy.py) for clustertool as its own process, which the
signal tests need.  Everything else is the moto server.  Intervals are 1 s (or 1 h where the test
signals the wait, so only an interrupted sleep lets the process end); no test asserts timing.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.aws.fakes import client_error
from tests.aws.faultproxy import FaultProxy
from tests.aws.test_fault_matrix import Harness
from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--no-ssh")
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")


def _no_capacity(kwargs):
    if kwargs.get("DryRun"):
        return None
    return client_error("InsufficientInstanceCapacity", "RunInstances", "We currently do not have sufficient capacity")


def test_no_capacity_for_two_attempts_then_the_cluster_comes_up_and_says_how_many_attempts(aws):
    name = unique("rtu")
    aws.faults.add("run_instances", _no_capacity, times=2 * len(ZONES))  # two whole rounds over every zone
    code, out, err = aws.ct(*UP, "--name", name, "--retry-until-up", "--retry-interval", "1s")
    assert code == 0, err
    for attempt in (1, 2):
        assert re.search(rf"attempt {attempt}: no p4d\.24xlarge capacity in {', '.join(ZONES)}; next try at "
                         r"\d\d:\d\d:\d\d \(waiting until \d\d:\d\d:\d\d at most\)", err), err
    assert "attempt 3:" not in err
    from clustertool.core import state

    record = state.load(name).provider_state  # what `up --json` prints as the cluster's provider_state
    assert record["launch_attempts"] == 3 and "capacity_wait" not in record
    assert {i["Placement"]["AvailabilityZone"] for i in aws.instances(name)} == {"us-east-1a"}
    assert len(aws.instances(name)) == 2
    assert len(aws.pgs.created) == 2 * len(ZONES) + 1 and len(aws.pgs.groups) == 1  # failed attempts left none
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_the_python_api_takes_the_same_keywords(aws):
    from clustertool import Cluster

    aws.faults.add("run_instances", _no_capacity, times=len(ZONES))  # one whole round
    lines: list[str] = []
    cluster = Cluster.up(name=unique("rta"), provider="aws", nodes=2, instance_type="p4d.24xlarge", no_ssh=True,
                         retry_until_up=True, retry_interval="1s", retry_for="1h", report=lines.append)
    assert cluster.record.provider_state["launch_attempts"] == 2
    attempts = [line for line in lines if line.startswith("attempt ")]
    assert len(attempts) == 1 and attempts[0].startswith(f"attempt 1: no p4d.24xlarge capacity in {', '.join(ZONES)}")
    plan = Cluster.plan(name=unique("rtp"), provider="aws", nodes=2, instance_type="p4d.24xlarge",
                        retry_until_up=True)
    assert "if no zone has capacity: try every zone again every 5m for at most 6h" in " ".join(plan)
    cluster.down()
    assert aws.total_leaks(cluster.name) == 0


def test_retry_for_spent_fails_in_one_line_with_the_attempts_and_the_capacity_exit_code_leaving_nothing(aws):
    plain = unique("rtp")
    aws.faults.add("run_instances", _no_capacity, times=999)
    plain_code, _, _ = aws.ct(*UP, "--name", plain)
    name = unique("rtx")
    code, _, err = aws.ct(*UP, "--name", name, "--retry-until-up", "--retry-interval", "1s", "--retry-for", "2s")
    assert code == plain_code != 0
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "could not launch 2 x p4d.24xlarge together in any Availability Zone" in errors[0]
    assert "us-east-1a: InsufficientInstanceCapacity" in errors[0]
    assert re.search(r"gave up after \d+ attempt\(s\) in \S+ \(--retry-for 2s\)", errors[0]), errors[0]
    assert aws.total_leaks(name) == 0 and aws.total_leaks(plain) == 0 and not aws.pgs.groups
    from clustertool.core import state

    assert not state.exists(name)


def test_a_quota_error_is_not_waited_out(aws):
    name = unique("rtq")
    aws.faults.add("run_instances", lambda kw: None if kw.get("DryRun") else client_error(
        "VcpuLimitExceeded", "RunInstances", "You have requested more vCPU capacity than your limit"), times=999)
    code, _, err = aws.ct(*UP, "--name", name, "--retry-until-up", "--retry-interval", "1h")
    assert code != 0 and "VcpuLimitExceeded" in err and "next try at" not in err
    assert aws.total_leaks(name) == 0


@pytest.mark.parametrize("flags, message", [
    (("--retry-until-up", "--retry-interval", "0"), "error: invalid --retry-interval '0': it must be at least one"),
    (("--retry-until-up", "--retry-interval", "soon"), "error: invalid --retry-interval 'soon'"),
    (("--retry-until-up", "--retry-interval", "10m", "--retry-for", "5m"),
     "error: --retry-for 5m is shorter than --retry-interval 10m"),
    (("--retry-interval", "5m"), "error: --retry-interval: only means something with --retry-until-up"),
    (("--retry-for", "1h"), "error: --retry-for: only means something with --retry-until-up"),
])
def test_bad_retry_values_are_one_line_and_make_nothing(aws, flags, message):
    name = unique("rtb")
    code, _, err = aws.ct(*UP, "--name", name, *flags)
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.splitlines()[0]]
    assert err.splitlines()[0].startswith(message), err
    assert aws.total_leaks(name) == 0 and "run_instances" not in aws.recorder.ops


def test_the_plan_says_it_will_wait_and_for_how_long_at_most(aws):
    code, out, err = aws.ct(*UP, "--name", unique("rtd"), "--dry-run", "--retry-until-up", "--retry-for", "2h")
    assert code == 0, err
    assert "if no zone has capacity: try every zone again every 5m for at most 2h" in out


# ---- clustertool as its own process: status while it waits, a signal during the wait ----------


@pytest.fixture
def fx(aws, tmp_path, monkeypatch):
    from clustertool.providers.aws import client

    monkeypatch.setattr(client, "HOOKS", [aws.recorder])  # in-process status/down reach plain moto too
    proxy = FaultProxy(aws.url)
    yield Harness(aws, proxy, tmp_path)
    proxy.close()


def _waiting(name: str, proc, timeout: float = 60) -> dict:
    """The state's record of the wait, once the `up` (``proc``) has found no capacity and sleeps."""
    from clustertool.core import state

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if state.exists(name):
            wait = state.load(name).provider_state.get("capacity_wait") or {}
            if wait.get("phase") == "waiting":
                return wait
        time.sleep(0.05)
    raise AssertionError("the up never started waiting for capacity")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_waiting_for_capacity_ends_up_at_once_and_leaves_nothing(fx, sig):
    from clustertool.core import state
    from clustertool.providers.aws import capacity_wait

    aws, name = fx.aws, unique("rts")
    fx.proxy.on("RunInstances", error="InsufficientInstanceCapacity", times=999)
    started = time.monotonic()
    proc = fx.start(*UP, "--name", name, "--retry-until-up", "--retry-interval", "1h", "--retry-for", "6h")
    wait = _waiting(name, proc)
    assert wait["attempt"] == 1 and wait["zones"] == list(ZONES)
    code, out, err = aws.ct("status", "-c", name, "--no-check")
    assert code == 0, err
    assert re.search(r"up: in progress \(pid \d+\); waiting for capacity: attempt 1 found none; next try at "
                     r"\d\d:\d\d \(giving up at \d\d:\d\d\)", out), out
    code, out, _ = aws.ct("status", "-c", name, "--no-check", "--json")
    assert json.loads(out)["capacity_wait"]["attempt"] == 1
    code, out, _ = aws.ct("ls", "--json")
    assert [c["waiting"] for c in json.loads(out) if c["name"] == name] == [
        f"waiting for capacity (attempt 1, next try at {capacity_wait.clock(wait['next_try'], False)})"]
    assert "waiting for capacity (attempt 1, next try at" in aws.ct("ls")[1]
    proc.send_signal(sig)
    result = fx.wait(proc, started, timeout=60)  # an uninterrupted sleep would last the hour
    assert result.code == 128 + sig, result.err  # 130 for Ctrl-C, 143 for SIGTERM
    assert "Traceback" not in result.err, result.err
    if sig == signal.SIGTERM:  # Ctrl-C ends with click's blank line, SIGTERM with the tool's one line
        assert result.errors == ["error: up stopped by SIGTERM; everything it had made was removed"], result.err
    why = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert f"up failed ({why}); removing what was made" in result.err, result.err
    assert not state.exists(name)
    code, _, err = aws.ct("status", "-c", name)
    assert code != 0 and name in err
    assert name not in aws.ct("ls")[1]
    assert aws.total_leaks(name) == 0
    assert fx.proxy.calls.count("RunInstances") == len(ZONES)  # one attempt, then the wait
