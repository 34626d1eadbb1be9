"""The fault matrix: clustertool as its own process, in front of it a loopback proxy to the moto
server (tests/aws/faultproxy.py) that sends SIGKILL/SIGTERM/SIGHUP to the process after a named
AWS call, delays, hangs, refuses, or empties moto (what a restarted server holds).

Every case ends with the documented recovery (none after SIGTERM/SIGHUP in `up`: it rolls back;
`down` after SIGKILL, or after a stopped `down`; `down --sweep` for a lost state) and asserts
that nothing the case made is left: instances not terminated, security groups, key pairs,
placement groups, volumes, network interfaces, Elastic IPs.  And that the error, where the
process lived to say one, is one line.

The default run takes a representative case of each kind; ``-m slow`` (``make test-faults``)
runs the whole matrix: every signal after every AWS call of `up` and of `down` (SIGKILL and SIGTERM after
every AWS call of `replace`).  With
CLUSTERTOOL_FAULT_TABLE=path, each case appends a row (case -> leaked count) to that file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.aws.faultproxy import FaultProxy, refusing_url
from tests.conftest import REPO, unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--no-ssh")
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


class Harness:
    """The moto world, a proxy in front of it, and clustertool processes talking through the proxy."""

    def __init__(self, aws, proxy: FaultProxy, tmp_path):
        self.aws, self.proxy, self.tmp = aws, proxy, tmp_path

    def env(self, url: str | None = None, **extra: str) -> dict:
        return {**os.environ, "AWS_ENDPOINT_URL": url or self.proxy.url, "CLUSTERTOOL_AWS_POLL": "0.01", **extra}

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "clustertool", *args], env=env or self.env(), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proxy.pid = proc.pid
        return proc

    def wait(self, proc: subprocess.Popen, started: float, timeout: float = 120) -> Result:
        out, err = proc.communicate(timeout=timeout)
        return Result(proc.returncode, out, err, time.monotonic() - started)

    def run(self, *args: str, env: dict | None = None, timeout: float = 120) -> Result:
        started = time.monotonic()
        return self.wait(self.start(*args, env=env), started, timeout)

    def steps(self, calls: list[str]) -> list[tuple[str, int]]:
        """(action, occurrence) of each call, repeats in a row (tagging node 1, 2 ...) as one step."""
        seen: dict[str, int] = {}
        out = []
        for i, action in enumerate(calls):
            seen[action] = seen.get(action, 0) + 1
            if i == 0 or calls[i - 1] != action:
                out.append((action, seen[action]))
        return out

    def recover(self, name: str) -> str:
        """The documented recovery: `down` when this home still knows the cluster."""
        from clustertool.core import state

        if not state.exists(name):
            return "none needed"
        code, _, err = self.aws.ct("down", "-c", name, "--yes")
        assert code == 0, err
        return "down"

    def leaked(self, name: str) -> int:
        return self.aws.total_leaks(name)


def record(case: str, code: int, recovery: str, leaked: int) -> None:
    path = os.environ.get("CLUSTERTOOL_FAULT_TABLE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"| {case} | {code} | {recovery} | {leaked} |\n")


@pytest.fixture
def fx(aws, tmp_path, monkeypatch):
    """Subprocesses reach plain moto (no placement groups there), so in-process calls here do too."""
    from clustertool.providers.aws import client

    monkeypatch.setattr(client, "HOOKS", [aws.recorder])
    proxy = FaultProxy(aws.url)
    yield Harness(aws, proxy, tmp_path)
    proxy.close()


def _all_clustertool_resources(aws) -> int:
    flt = [{"Name": "tag-key", "Values": ["clustertool:cluster"]}]
    live = flt + [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped",
                                                             "shutting-down"]}]
    return (sum(len(r["Instances"]) for r in aws.ec2.describe_instances(Filters=live)["Reservations"])
            + len(aws.ec2.describe_security_groups(Filters=flt)["SecurityGroups"])
            + len(aws.ec2.describe_key_pairs(Filters=flt)["KeyPairs"])
            + len(aws.ec2.describe_volumes(Filters=flt)["Volumes"])
            + len(aws.ec2.describe_network_interfaces()["NetworkInterfaces"])
            + len(aws.ec2.describe_addresses()["Addresses"]))


# ---- signals in `up` ----------------------------------------------------------------------


def signal_in_up(fx: Harness, sig_name: str, action: str, nth: int = 1, extra: tuple[str, ...] = ()) -> int:
    """One case: the signal after the nth call of ``action`` (``extra``: more `up` flags); returns the leaked
    count after recovery."""
    from clustertool.core import state

    name = unique("su")
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, nth, signal=SIGNALS[sig_name])
    result = fx.run(*UP, "--name", name, *extra)
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, nth, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
    else:
        assert result.code == 128 + SIGNALS[sig_name], result.err
        assert result.errors in ([f"error: up stopped by {sig_name}; everything it had made was removed"],
                                 [f"error: up stopped by {sig_name} before it made anything"]), result.err
        assert not state.exists(name) and fx.leaked(name) == 0  # rolled back by itself
        assert "Traceback" not in result.err
    recovery = fx.recover(name)
    leaked = fx.leaked(name)
    record(f"{sig_name} in up {' '.join(extra) + ' ' if extra else ''}after {action} #{nth}", result.code, recovery,
           leaked)
    return leaked


@pytest.mark.parametrize("sig_name, action", [("SIGTERM", "RunInstances"), ("SIGHUP", "CreateSecurityGroup"),
                                              ("SIGTERM", "DescribeInstanceStatus")])
def test_sigterm_and_sighup_in_up_roll_back_like_ctrl_c(fx, sig_name, action):
    assert signal_in_up(fx, sig_name, action) == 0


def test_sigkill_after_run_instances_status_shows_the_real_instances_and_down_removes_them(fx):
    from clustertool.core import state

    name = unique("kill")
    fx.proxy.on("RunInstances", signal=signal.SIGKILL)
    result = fx.run(*UP, "--name", name)
    assert result.code == -signal.SIGKILL and state.load(name).nodes == []  # killed before it saw the answer
    code, out, err = fx.aws.ct("status", "-c", name, "--no-check", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["status"] == "provisioning" and [n["state"] for n in shown["nodes"]] == ["running", "running"]
    assert sum(n["slots"] for n in shown["nodes"]) == 16
    assert shown["hourly price"].startswith("$65.55/h")
    assert "did not finish" in shown["up"] and f"clustertool down -c {name} --yes" in shown["up"]
    assert fx.recover(name) == "down" and fx.leaked(name) == 0


@pytest.mark.slow
def test_every_signal_after_every_aws_call_of_up_leaves_nothing_after_recovery(fx):
    name = unique("rec")
    fx.proxy.calls.clear()
    assert fx.run(*UP, "--name", name).code == 0
    calls = list(fx.proxy.calls)
    assert fx.recover(name) == "down"
    table = [(sig, action, nth, signal_in_up(fx, sig, action, nth))
             for action, nth in fx.steps(calls) for sig in SIGNALS]
    assert [row for row in table if row[3]] == []
    assert len(table) >= 3 * 20
    assert _all_clustertool_resources(fx.aws) == 0


# ---- signals in `up --scheduler slurm`: the nodes' user data installs Slurm's packages ---------------------

SLURM = ("--scheduler", "slurm")


@pytest.mark.parametrize("sig_name, action", [("SIGKILL", "RunInstances"), ("SIGTERM", "RunInstances"),
                                              ("SIGHUP", "DescribeInstanceStatus")])
def test_a_signal_in_up_with_slurm_leaves_nothing_after_recovery(fx, sig_name, action):
    assert signal_in_up(fx, sig_name, action, extra=SLURM) == 0


@pytest.mark.slow
def test_every_signal_after_every_aws_call_of_up_with_slurm_leaves_nothing_after_recovery(fx):
    name = unique("recs")
    fx.proxy.calls.clear()
    assert fx.run(*UP, "--name", name, *SLURM).code == 0
    calls = list(fx.proxy.calls)
    assert fx.recover(name) == "down"
    table = [(sig, action, nth, signal_in_up(fx, sig, action, nth, SLURM))
             for action, nth in fx.steps(calls) for sig in SIGNALS]
    assert [row for row in table if row[3]] == []
    assert _all_clustertool_resources(fx.aws) == 0


# ---- signals while `up` makes shared filesystems (EFS, FSx for Lustre) ------------------------


def _file_systems(aws) -> int:
    """Every EFS and FSx file system moto holds (the tests make no others)."""
    import boto3

    efs = boto3.client("efs", endpoint_url=aws.url, region_name="us-east-1")
    fsx = boto3.client("fsx", endpoint_url=aws.url, region_name="us-east-1")
    return len(efs.describe_file_systems()["FileSystems"]) + len(fsx.describe_file_systems()["FileSystems"])


def signal_in_shared_fs_up(fx: Harness, sig_name: str, action: str, shared: str) -> int:
    """``up --shared-fs SHARED`` signalled after ``action``; leaked resources (file systems too) after recovery.
    The signal comes right after a create, before the file system is ever waited on (moto's FSx answers
    carry no Lifecycle, so a subprocess could not see one become available)."""
    name = unique("sfs")
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, signal=SIGNALS[sig_name])
    result = fx.run(*UP, "--name", name, "--shared-fs", shared)
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
    else:
        assert result.code == 128 + SIGNALS[sig_name] and "Traceback" not in result.err, result.err
        assert result.errors == [f"error: up stopped by {sig_name}; everything it had made was removed"], result.err
    recovery = fx.recover(name)
    leaked = fx.leaked(name) + _file_systems(fx.aws)
    record(f"{sig_name} in up --shared-fs {shared} after {action}", result.code, recovery, leaked)
    return leaked


@pytest.mark.parametrize("sig_name, action, shared", [
    ("SIGKILL", "efs:CreateFileSystem", "efs"),
    pytest.param("SIGTERM", "efs:CreateFileSystem", "efs", marks=pytest.mark.slow),
    pytest.param("SIGKILL", "efs:CreateMountTarget", "efs", marks=pytest.mark.slow),
    pytest.param("SIGTERM", "efs:CreateMountTarget", "efs", marks=pytest.mark.slow),
    pytest.param("SIGKILL", "CreateFileSystem", "fsx", marks=pytest.mark.slow),  # FSx (JSON protocol)
    pytest.param("SIGTERM", "CreateFileSystem", "fsx", marks=pytest.mark.slow),
])
def test_a_signal_while_up_makes_a_shared_fs_leaves_nothing_after_recovery(fx, sig_name, action, shared):
    assert signal_in_shared_fs_up(fx, sig_name, action, shared) == 0


# ---- signals in `down` --------------------------------------------------------------------


def signal_in_down(fx: Harness, sig_name: str, action: str, nth: int = 1) -> int:
    from clustertool.core import state

    name = unique("sd")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, nth, signal=SIGNALS[sig_name])
    result = fx.run("down", "-c", name, "--yes")
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, nth, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
    else:
        assert result.code == 128 + SIGNALS[sig_name], result.err
        assert result.errors == [f"error: down stopped by {sig_name} after its current step; the state is kept"]
        assert f"hint: run `clustertool down -c {name} --yes` again to finish" in result.err
    assert state.exists(name)  # a second down can finish
    recovery = fx.recover(name)
    leaked = fx.leaked(name)
    record(f"{sig_name} in down after {action} #{nth}", result.code, recovery, leaked)
    return leaked


@pytest.mark.parametrize("sig_name, action", [("SIGTERM", "TerminateInstances"), ("SIGHUP", "DeleteSecurityGroup"),
                                              ("SIGKILL", "TerminateInstances")])
def test_a_signal_in_down_lets_the_current_delete_finish_and_a_second_down_completes(fx, sig_name, action):
    assert signal_in_down(fx, sig_name, action) == 0


@pytest.mark.slow
def test_every_signal_after_every_aws_call_of_down_leaves_nothing_after_a_second_down(fx):
    name = unique("drec")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    fx.proxy.calls.clear()
    assert fx.run("down", "-c", name, "--yes").code == 0
    calls = list(fx.proxy.calls)
    assert {"TerminateInstances", "DeleteSecurityGroup", "DeleteKeyPair"} <= set(calls)
    table = [(sig, action, nth, signal_in_down(fx, sig, action, nth))
             for action, nth in fx.steps(calls) for sig in SIGNALS]
    assert [row for row in table if row[3]] == []
    assert _all_clustertool_resources(fx.aws) == 0


# ---- signals in `replace` (tests/aws/test_replace_aws.py has the rest of replace) --------------------


def signal_in_replace(fx: Harness, sig_name: str, action: str, nth: int = 1, args: tuple = ("node-2",)) -> int:
    """`replace ARGS` with the signal after the nth call of ``action``.  After SIGTERM/SIGHUP it has put
    things right by itself: the instances that run are exactly the nodes' (the old node with nothing
    new, or the new node with the old one gone or, --keep-old, kept).  Then `down`; returns the leaked count."""
    from clustertool.core import state

    name = unique("sr")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, nth, signal=SIGNALS[sig_name])
    result = fx.run("replace", *args, "--yes", "-c", name)
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, nth, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
    else:
        assert result.code == 128 + SIGNALS[sig_name], result.err
        assert len(result.errors) == 1 and result.errors[0].startswith(f"error: replace stopped by {sig_name}"), \
            result.err
        assert "Traceback" not in result.err
        now = state.load(name)
        kept = {k["instance"] for k in now.provider_state.get("replaced_kept", [])}
        live = {i["InstanceId"] for i in fx.aws.instances(name)}
        assert live - kept == {n.instance_id for n in now.nodes}, (action, nth, result.err)
    recovery = fx.recover(name)
    leaked = fx.leaked(name)
    record(f"{sig_name} in replace {' '.join(args)} after {action} #{nth}", result.code, recovery, leaked)
    return leaked


def test_sigterm_in_replace_after_run_instances_removes_the_unseen_new_instance_and_down_leaves_nothing(fx):
    """The signal comes before the process sees RunInstances' answer: the new instance is found by its
    client token and removed (Ctrl-C while waiting: tests/aws/test_replace_aws.py)."""
    assert signal_in_replace(fx, "SIGTERM", "RunInstances") == 0


@pytest.mark.slow
@pytest.mark.parametrize("args, own_calls", [(("node-2",), {"TerminateInstances"}),
                                             (("leader",), {"AssociateAddress", "TerminateInstances"}),
                                             (("node-2", "--keep-old"), {"CreateTags", "StopInstances"})])
def test_sigkill_and_sigterm_after_every_aws_call_of_replace_leave_nothing_after_down(fx, args, own_calls):
    name = unique("rrec")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    fx.proxy.calls.clear()
    replaced = fx.run("replace", *args, "--yes", "-c", name)
    assert replaced.code == 0, replaced.err
    calls = list(fx.proxy.calls)
    assert {"RunInstances", "DescribeInstanceStatus"} | own_calls <= set(calls)
    assert fx.recover(name) == "down"
    table = [(sig, action, nth, signal_in_replace(fx, sig, action, nth, args))
             for action, nth in fx.steps(calls) for sig in ("SIGKILL", "SIGTERM")]
    assert [row for row in table if row[3]] == []
    assert _all_clustertool_resources(fx.aws) == 0


# ---- signals in `up --capacity-reservation` (the EC2 stand-in between the proxy and moto) -------------

RESERVED_UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "p5.48xlarge", "--no-ssh")


@pytest.fixture
def fxr(fx, ec2front):
    """The matrix with tests/aws/ec2front.py between the proxy and moto: it answers the reservation and
    topology calls moto lacks; a 4-instance reservation for the cases to launch into."""
    proxy = FaultProxy(ec2front.url)
    rid = ec2front.add_reservation("p5.48xlarge", "us-east-1b", 4)["CapacityReservationId"]
    yield Harness(fx.aws, proxy, fx.tmp), ec2front, rid
    proxy.close()


def signal_in_reserved_up(fxr, sig_name: str, action: str, nth: int = 1) -> int:
    """`up --capacity-reservation` with the signal after the nth ``action``; the leaked count after recovery
    counts the reservation's instances not given back too."""
    from clustertool.core import state

    h, front, rid = fxr
    name = unique("sv")
    front.topology_by_launch([["nn-s", "nn-a", f"nn-{k % 2}"] for k in range(2)])
    h.proxy.rules.clear()
    h.proxy.signalled.clear()
    h.proxy.on(action, nth, signal=SIGNALS[sig_name])
    result = h.run(*RESERVED_UP, "--capacity-reservation", rid, "--name", name)
    assert h.proxy.signalled == [(action, SIGNALS[sig_name])], (action, nth, result.err)
    if sig_name != "SIGKILL":
        assert result.code == 128 + SIGNALS[sig_name], result.err
        assert len(result.errors) == 1 and result.errors[0].startswith(f"error: up stopped by {sig_name}"), result.err
        assert not state.exists(name) and h.leaked(name) == 0 and "Traceback" not in result.err
    recovery = h.recover(name)
    leaked = h.leaked(name) + 4 - front.reservation(rid)["AvailableInstanceCount"]
    record(f"{sig_name} in up --capacity-reservation after {action} #{nth}", result.code, recovery, leaked)
    return leaked


def test_sigterm_in_up_after_describe_instance_topology_gives_the_reservation_back(fxr):
    assert signal_in_reserved_up(fxr, "SIGTERM", "DescribeInstanceTopology") == 0
    assert "DescribeCapacityReservations" in fxr[0].proxy.calls


@pytest.mark.slow
def test_every_signal_after_every_aws_call_of_up_into_a_reservation_leaves_nothing_after_recovery(fxr):
    h, front, rid = fxr
    front.topology_by_launch([["nn-s", "nn-a", "nn-0"], ["nn-s", "nn-a", "nn-1"]])
    name = unique("rrv")
    h.proxy.calls.clear()
    assert h.run(*RESERVED_UP, "--capacity-reservation", rid, "--name", name).code == 0
    calls = list(h.proxy.calls)
    assert {"DescribeCapacityReservations", "DescribeInstanceTopology", "RunInstances"} <= set(calls)
    assert h.recover(name) == "down"
    table = [(sig, action, nth, signal_in_reserved_up(fxr, sig, action, nth))
             for action, nth in h.steps(calls) for sig in SIGNALS]
    assert [row for row in table if row[3]] == []
    assert _all_clustertool_resources(h.aws) == 0


# ---- two `up`s of one name; `down` and `--sweep` during `up` ------------------------------------


# An `up` whose call the proxy holds: a read timeout (a fifth of the retry budget) must not end the hold and
# send the call again behind the test's back, however long the test takes on a loaded machine.
HELD_UP = {"CLUSTERTOOL_AWS_API_TIMEOUT": "600"}


def _wait_for(proxy: FaultProxy, action: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while action not in proxy.calls:
        assert time.monotonic() < deadline, f"no {action} within {timeout}s: {proxy.calls}"
        time.sleep(0.02)


def test_two_ups_of_one_name_from_one_home_the_second_is_refused_and_makes_nothing(fx):
    name = unique("twin")
    held = fx.proxy.on("RunInstances", held=True)  # the first `up` is in flight until the second has ended
    started = time.monotonic()
    first = fx.start(*UP, "--name", name, env=fx.env(**HELD_UP))
    _wait_for(fx.proxy, "CreateSecurityGroup")
    second = fx.run(*UP, "--name", name)
    held.release()
    assert second.code != 0 and second.errors == [f"error: cluster {name!r} is being created by pid {first.pid}"]
    first_result = fx.wait(first, started)
    assert first_result.code == 0, first_result.err
    assert fx.aws.leaks(name)["instances"] == 2 and fx.aws.leaks(name)["security_groups"] == 2  # + the leader's
    record("two ups of one name, one home", second.code, fx.recover(name), fx.leaked(name))
    assert fx.leaked(name) == 0


def test_two_ups_of_one_name_from_two_homes_the_second_is_refused_and_makes_nothing(fx):
    name = unique("twin")
    held = fx.proxy.on("RunInstances", held=True)  # the first `up` is in flight until the second has ended
    started = time.monotonic()
    first = fx.start(*UP, "--name", name, env=fx.env(**HELD_UP))
    _wait_for(fx.proxy, "CreateSecurityGroup")
    second = fx.run(*UP, "--name", name, env=fx.env(CLUSTERTOOL_HOME=str(fx.tmp / "other-home")))
    held.release()
    assert second.code != 0 and len(second.errors) == 1, second.err
    assert f"cluster name {name!r} is already used in us-east-1" in second.errors[0]
    assert "up in flight" in second.errors[0]
    assert fx.wait(first, started).code == 0
    assert fx.aws.leaks(name)["instances"] == 2 and fx.aws.leaks(name)["security_groups"] == 2  # + the leader's
    record("two ups of one name, two homes", second.code, fx.recover(name), fx.leaked(name))
    assert fx.leaked(name) == 0


@pytest.mark.slow
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_two_ups_of_one_name_from_two_homes_at_the_same_moment_exactly_one_wins(fx, attempt):
    name = unique("race")
    started = time.monotonic()
    procs = [fx.start(*UP, "--name", name, env=fx.env(CLUSTERTOOL_HOME=str(fx.tmp / f"home-{k}")))
             for k in (1, 2)]
    results = [fx.wait(p, started) for p in procs]
    assert sorted(r.code == 0 for r in results) == [False, True], [r.err for r in results]
    loser = next(r for r in results if r.code != 0)
    assert len(loser.errors) == 1 and ("already used" in loser.errors[0] or "a moment earlier" in loser.errors[0])
    winner_home = fx.tmp / f"home-{1 + [r.code for r in results].index(0)}"
    assert fx.aws.leaks(name)["security_groups"] == 2  # + the leader's
    down = fx.run("down", "-c", name, "--yes", env=fx.env(CLUSTERTOOL_HOME=str(winner_home)))
    assert down.code == 0, down.err
    record(f"two ups at the same moment, two homes (#{attempt})", loser.code, "down (winner)", fx.leaked(name))
    assert fx.leaked(name) == 0


def test_sweeps_during_up_touch_nothing_and_down_stops_that_up_leaving_nothing(fx):
    name = unique("busy")
    fx.proxy.on("DescribeInstanceStatus", held=True)  # the `up` stays in flight until `down` stops it
    started = time.monotonic()
    up = fx.start(*UP, "--name", name, env=fx.env(**HELD_UP))
    _wait_for(fx.proxy, "DescribeInstanceStatus")   # RunInstances is done: the instances exist
    code, out, err = fx.aws.ct("down", "--sweep", "--yes", "--json")  # this home: the cluster is known
    assert code == 0 and json.loads(out)["orphans"] == [], out
    other = fx.run("down", "--sweep", "--yes", "--json", "--force-owner",
                   env=fx.env(fx.aws.url, CLUSTERTOOL_HOME=str(fx.tmp / "other-home")))
    assert other.code == 0, other.err
    [found] = [o for o in json.loads(other.out)["orphans"] if o["name"] == name]
    assert found["action"] == "keep" and "up in flight" in found["why"]
    code, out, err = fx.aws.ct("down", "-c", name)   # no terminal to ask on: not without --yes
    # no terminal to ask on: refused, naming the `up` and its pid, with the --yes form as the hint (issue 33)
    assert code != 0 and f"error: refusing to stop the `up` of {name!r} (pid {up.pid}) without --yes" in err, err
    assert f"clustertool down -c {name} --yes" in err
    code, out, err = fx.aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert f"stopped the `up` of {name!r} (pid {up.pid})" in out, out
    result = fx.wait(up, started)
    assert result.code != 0 and "up stopped by SIGTERM" in result.err, result.err   # it says what it did
    record("down during up (same home): stops it", code, fx.recover(name), fx.leaked(name))
    assert fx.leaked(name) == 0


def test_a_killed_up_of_another_home_is_kept_while_its_lease_lives_and_swept_after(fx):
    from clustertool.core import state

    name = unique("dead")
    bob = fx.tmp / "bob-home"
    fx.proxy.on("RunInstances", signal=signal.SIGKILL)
    result = fx.run(*UP, "--name", name, env=fx.env(CLUSTERTOOL_HOME=str(bob), CLUSTERTOOL_AWS_LEASE="4"))
    assert result.code == -signal.SIGKILL
    code, out, _ = fx.aws.ct("down", "--sweep", "--yes", "--json")
    [found] = json.loads(out)["orphans"]
    assert found["action"] == "keep" and "up in flight" in found["why"] and fx.aws.leaks(name)["instances"] == 2
    time.sleep(4.5)
    code, out, err = fx.aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 0, err
    [found] = json.loads(out)["orphans"]
    assert found["action"] == "delete" and "another owner's up died" in found["why"]
    leaked = fx.leaked(name)
    record("SIGKILL in up after RunInstances (other home), --sweep after the lease", result.code, "down --sweep",
           leaked)
    assert leaked == 0
    os.environ["CLUSTERTOOL_HOME"] = str(bob)  # bob's own state: down now finds nothing left and forgets it
    try:
        assert fx.aws.ct("down", "-c", name, "--yes")[0] == 0 and not state.exists(name)
    finally:
        os.environ["CLUSTERTOOL_HOME"] = str(fx.tmp / "cthome")


# ---- broken endpoints ---------------------------------------------------------------------------


def _ready(fx: Harness, prefix: str) -> tuple[str, str]:
    from clustertool.core import state

    name = unique(prefix)
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    return name, state.state_path(name).read_text()


RETRY_LINE = re.compile(r"^» retrying (\S+) \((\d+)/(\d+)\) in ([0-9.]+)s: (.+)$", re.M)
GAVE_UP = re.compile(r"cannot reach AWS at \S+: (\S+): (.+); (\d+) attempt\(s\) over (\d+)s$")


def _one_call_retried_within(result: Result, budget: float, hung: bool) -> tuple[str, int]:
    """What the retry budget bounds, read from the tool's own lines, not from the wall clock (which counts
    the process's start, slowed by load): one call retried, its attempts numbered 2, 3 ... in order (the
    budget is never spent twice), every retry planned inside the budget (the pauses it announced, plus
    each attempt's timeout -- a fifth of the budget -- for the attempts that hung and the next one), and the
    time it reports from its first attempt to its last within the budget (a second's slack: the last
    attempt's own run on a loaded machine).  Returns (the call, its attempt count)."""
    per_attempt = budget / 5
    retries = RETRY_LINE.findall(result.err)
    assert retries, result.err
    op = retries[0][0]
    assert [(r[0], int(r[1]), int(r[2])) for r in retries] == [(op, k, 5) for k in range(2, len(retries) + 2)], \
        result.err
    gave_up = GAVE_UP.search(result.errors[0])
    assert gave_up, result.errors[0]
    attempts = int(gave_up.group(3))
    assert gave_up.group(1) == op and attempts == len(retries) + 1 <= 5, result.err
    paused = sum(float(r[3]) for r in retries)
    planned = paused + per_attempt * (attempts if hung else 1)
    assert planned <= budget + 0.05 * len(retries), (planned, result.err)  # + the pauses' rounding as shown
    assert int(gave_up.group(4)) <= budget + 1, result.err
    return op, attempts


@pytest.mark.parametrize("budget", ["4", pytest.param(None, marks=pytest.mark.slow)])
def test_a_refusing_endpoint_gives_one_error_line_fast_and_keeps_the_state(fx, budget):
    """A 4 s budget in the default run (fewer retries, a faster suite); the default 60 s in the slow one."""
    from clustertool.core import state

    name, saved = _ready(fx, "refuse")
    env = fx.env(refusing_url(), **({"CLUSTERTOOL_AWS_API_TIMEOUT": budget} if budget else {}))
    for args in (("status", "-c", name, "--no-check"), ("down", "-c", name, "--yes"), (*UP, "--name", unique("r"))):
        result = fx.run(*args, env=env)
        assert result.code != 0 and len(result.errors) == 1, result.err
        assert result.errors[0].startswith("error: cannot reach AWS at http://127.0.0.1:")
        assert "connection refused" in result.errors[0] and "(2/5)" in result.err
        # gave up within the budget: the tool's own account (the wall clock also counts the process's start)
        _, attempts = _one_call_retried_within(result, float(budget or 60), hung=False)
        record(f"refusing endpoint ({budget or 'default 60'} s budget): {args[0]} after {attempts} attempts",
               result.code, "-", 0)
    assert state.state_path(name).read_text() == saved
    assert fx.recover(name) == "down" and fx.leaked(name) == 0


@pytest.mark.parametrize("budget", ["4", pytest.param(None, marks=pytest.mark.slow)])
def test_a_hanging_endpoint_fails_status_and_down_within_the_budget(fx, budget):
    """CLUSTERTOOL_AWS_API_TIMEOUT=4 in the default run; the default budget (60 s) in the slow one."""
    from clustertool.core import state

    name, saved = _ready(fx, "hang")
    fx.proxy.hang_all()
    extra = {"CLUSTERTOOL_AWS_API_TIMEOUT": budget} if budget else {}
    limit = float(budget or 60)
    for args in (("status", "-c", name, "--no-check"), ("down", "-c", name, "--yes")):
        fx.proxy.calls.clear()
        result = fx.run(*args, env=fx.env(**extra), timeout=limit + 60)
        assert result.code != 0 and len(result.errors) == 1, result.err
        assert "no answer (read timeout)" in result.errors[0] and "retrying" in result.err
        # each attempt timed out at a fifth of the budget and the retries stopped inside it: the tool's own
        # account, and the proxy saw exactly the attempts it counts, of one call, and nothing after
        op, attempts = _one_call_retried_within(result, limit, hung=True)
        assert fx.proxy.calls == [op] * attempts, (fx.proxy.calls, result.err)
        record(f"hanging endpoint ({budget or 'default 60'} s budget): {args[0]} after {attempts} attempts",
               result.code, "-", 0)
    assert state.state_path(name).read_text() == saved
    assert fx.recover(name) == "down" and fx.leaked(name) == 0


def test_an_endpoint_restarted_empty_during_up_fails_it_in_one_line_and_leaves_nothing(fx):
    from clustertool.core import state

    name = unique("empty")
    fx.proxy.on("RunInstances", reset=True)
    result = fx.run(*UP, "--name", name)
    assert result.code != 0 and len(result.errors) == 1, result.err
    assert not state.exists(name)
    record("endpoint restarted empty after RunInstances in up", result.code, fx.recover(name), fx.leaked(name))
    assert fx.leaked(name) == 0 and _all_clustertool_resources(fx.aws) == 0


def test_a_cluster_whose_endpoint_restarted_empty_comes_down_cleanly(fx):
    import urllib.request

    name, _ = _ready(fx, "gone")
    urllib.request.urlopen(urllib.request.Request(fx.aws.url + "/moto-api/reset", method="POST"), timeout=10).read()
    result = fx.run("status", "-c", name, "--no-check")
    assert result.code == 0 and result.out.count("missing") == 2, result.out
    down = fx.run("down", "-c", name, "--yes")
    assert down.code == 0 and "nothing of this cluster was left in AWS" in down.err
    record("endpoint restarted empty, then status and down", down.code, "-", fx.leaked(name))
    assert fx.leaked(name) == 0
