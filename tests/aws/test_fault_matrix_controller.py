"""The fault matrix's rows for the recovery controller's identity (providers/aws/controller_iam.py), in the
matrix's style (tests/aws/test_fault_matrix.py: clustertool as its own process behind the fault proxy):
SIGKILL and SIGTERM after every IAM/EC2 call that makes the role, its policy, the instance profile and the
association, and after every call `down` makes to remove them; then the documented recovery (`down`, or a
second `down`), and nothing may be left: no instance, group, key, interface, address (the matrix's count),
no role or instance profile under /clustertool/ and no association (tests/aws/iamworld.py).

Until `up --controller` exists (phase B), the making runs as a small Python process calling the provider's
hook, ``controller_identity`` (the very code `up` will call), with the CLI's SIGTERM handling.
The default run takes one case; ``-m slow`` (``make test-faults``) runs every row.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import tests.aws.test_fault_matrix
from tests.aws import iamworld
from tests.aws.test_fault_matrix import SIGNALS, UP, Harness, Result, record
from tests.conftest import REPO, unique

pytestmark = pytest.mark.aws

fx = tests.aws.test_fault_matrix.fx  # the matrix's fixture: moto behind the fault proxy, clustertool as processes

MAKE_CALLS = ("DescribeIamInstanceProfileAssociations", "GetCallerIdentity", "DescribeInstances", "CreateRole",
              "PutRolePolicy", "CreateInstanceProfile", "AddRoleToInstanceProfile", "AssociateIamInstanceProfile")
READS = MAKE_CALLS[:3]
REMOVE_CALLS = ("DisassociateIamInstanceProfile", "GetInstanceProfile", "RemoveRoleFromInstanceProfile",
                "DeleteInstanceProfile", "DeleteRolePolicy", "DeleteRole")
# what `up --controller` will run: the provider's hook, under the CLI's signal handling (core.interrupts)
MAKE = """
import sys
from clustertool.cluster.session import ClusterSession
from clustertool.core import interrupts
from clustertool.core.errors import ToolError

interrupts.install()
session = ClusterSession.load(sys.argv[1])
try:
    for line in session.provider.controller_identity(session.record, sys.argv[2], save=session.save):
        print(line)
except interrupts.Terminated as exc:
    sys.stderr.write(f"error: {exc.message}\\n")
    sys.exit(exc.exit_code)
except ToolError as exc:
    sys.stderr.write(f"error: {exc.message}\\n")
    sys.exit(1)
"""


def make_identity(fx: Harness, name: str, node: str = "leader") -> Result:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", MAKE, name, node], env=fx.env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fx.proxy.pid = proc.pid
    return fx.wait(proc, started)


def leaked(fx: Harness, name: str) -> int:
    return fx.leaked(name) + iamworld.leaks(fx.aws.url, name)


def signal_in_controller_identity(fx: Harness, sig_name: str, action: str) -> int:
    """The identity's making signalled after ``action``; after SIGTERM it removed what it made by itself.
    Then `down`; returns what is left of the cluster, its identity included."""
    from clustertool.core import state

    name = unique("ctl")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, signal=SIGNALS[sig_name])
    result = make_identity(fx, name)
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
        # recorded before the first call that makes anything
        assert ("controller_identity" in state.load(name).provider_state) == (action not in READS)
    else:
        assert result.code == 128 + SIGNALS[sig_name] and "Traceback" not in result.err, result.err
        undone = "nothing was made" if action in READS else "what it had made was removed"
        assert result.errors == [f"error: making the controller's identity stopped by {sig_name}; {undone}"], \
            result.err
        assert iamworld.leaks(fx.aws.url, name) == 0
        assert "controller_identity" not in state.load(name).provider_state
    recovery = fx.recover(name)
    left = leaked(fx, name)
    record(f"{sig_name} in the controller's identity after {action}", result.code, recovery, left)
    return left


@pytest.mark.parametrize("sig_name, action", [("SIGKILL", "AssociateIamInstanceProfile")] + [
    pytest.param(sig, action, marks=pytest.mark.slow) for action in MAKE_CALLS for sig in ("SIGKILL", "SIGTERM")
    if (sig, action) != ("SIGKILL", "AssociateIamInstanceProfile")])
def test_a_signal_while_the_controller_s_identity_is_made_leaves_nothing_after_recovery(fx, sig_name, action):
    assert signal_in_controller_identity(fx, sig_name, action) == 0


def signal_in_down_of_a_controller(fx: Harness, sig_name: str, action: str) -> int:
    """`down` of a cluster with a controller's identity, signalled after ``action``; a second `down` finishes."""
    from clustertool.core import state

    name = unique("ctd")
    assert fx.aws.ct(*UP, "--name", name)[0] == 0
    made = make_identity(fx, name)
    assert made.code == 0 and iamworld.leaks(fx.aws.url, name) == 3, made.err  # role, profile, association
    fx.proxy.rules.clear()
    fx.proxy.signalled.clear()
    fx.proxy.on(action, signal=SIGNALS[sig_name])
    result = fx.run("down", "-c", name, "--yes")
    assert fx.proxy.signalled == [(action, SIGNALS[sig_name])], (action, fx.proxy.calls)
    if sig_name == "SIGKILL":
        assert result.code == -signal.SIGKILL
    else:
        assert result.code == 128 + SIGNALS[sig_name], result.err
        assert result.errors == [f"error: down stopped by {sig_name} after its current step; the state is kept"]
    assert state.exists(name)
    recovery = fx.recover(name)
    left = leaked(fx, name)
    record(f"{sig_name} in down (controller's identity) after {action}", result.code, recovery, left)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("action", REMOVE_CALLS)
@pytest.mark.parametrize("sig_name", ["SIGKILL", "SIGTERM"])
def test_a_signal_while_down_removes_the_controller_s_identity_and_a_second_down_leaves_nothing(fx, sig_name, action):
    assert signal_in_down_of_a_controller(fx, sig_name, action) == 0
    assert iamworld.every_controller_resource(fx.aws.url) == 0
