"""An exception or Ctrl-C at each step of `up` leaves zero tagged resources.

The steps are the AWS calls a clean `up` makes (repeats in a row, like tagging each node,
count as one step), recorded at the client seam; each case
injects a fault at one call index there (before the call runs, or - for Ctrl-C - after it
ran, so the resource exists but the tool never saw its id).  moto cannot fail on request,
so the seam raises; everything else is the moto server.  The server is not reset between
cases (each case has its own cluster name), which keeps the matrix fast.
"""

from __future__ import annotations

import pytest

from tests.aws.fakes import client_error
from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--no-ssh")


class AtCall:
    """Raise at the index-th AWS call (0-based), before or after the real call."""

    def __init__(self, index: int, exc: BaseException, after: bool):
        self.index, self.exc, self.after, self.seen, self.fired = index, exc, after, 0, None

    def __call__(self, service, op, kwargs, call):
        i = self.seen
        self.seen += 1
        if i != self.index:
            return call()
        if self.after:
            try:
                call()
            except Exception:  # the call failed by itself (e.g. ParameterNotFound); Ctrl-C lands anyway
                pass
        self.fired = op
        raise self.exc


def _up_ops(aws) -> list[str]:
    name = unique("rec")
    start = len(aws.recorder.ops)
    assert aws.ct(*UP, "--name", name)[0] == 0
    ops = aws.recorder.ops[start:]
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    return ops


def _steps(ops: list[str]) -> list[tuple[int, str]]:
    """(call index, op) of each step: repeats in a row (tagging node 1, 2, 3) are one step."""
    return [(i, op) for i, op in enumerate(ops) if i == 0 or ops[i - 1] != op]


def _all_clustertool_resources(aws) -> int:
    flt = [{"Name": "tag-key", "Values": ["clustertool:cluster"]}]
    live = flt + [{"Name": "instance-state-name",
                   "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}]
    return (sum(len(r["Instances"]) for r in aws.ec2.describe_instances(Filters=live)["Reservations"])
            + len(aws.ec2.describe_security_groups(Filters=flt)["SecurityGroups"])
            + len(aws.ec2.describe_key_pairs(Filters=flt)["KeyPairs"])
            + len([v for v in aws.ec2.describe_volumes(Filters=flt)["Volumes"]])
            + len(aws.pgs.groups))


@pytest.mark.parametrize("kind", ["exception-before-call", "ctrl-c-after-call"])
def test_fault_at_each_step_of_up_leaves_zero_tagged_resources(aws, kind):
    from clustertool.core import state
    from clustertool.providers.aws import client

    ops = _up_ops(aws)
    assert {"create_security_group", "import_key_pair", "create_placement_group", "run_instances",
            "create_tags", "describe_instance_status"} <= set(ops)
    table = []
    for index, op in _steps(ops):
        name = unique("f")
        exc = KeyboardInterrupt() if kind.startswith("ctrl-c") else RuntimeError(f"injected at {op}")
        fault = AtCall(index, exc, after=kind.endswith("after-call"))
        client.HOOKS.insert(1, fault)
        try:
            code, _, err = aws.ct(*UP, "--name", name)
        finally:
            client.HOOKS.remove(fault)
        assert fault.fired == op
        assert code != 0 and "Traceback" not in err
        if state.exists(name):  # the rollback itself failed: `down` must finish the job
            assert aws.ct("down", "-c", name, "--yes")[0] == 0
        table.append((index, op, aws.total_leaks(name)))
    print("\n".join(f"{kind} at call {i} ({op}): {n} leaked" for i, op, n in table))
    assert [row for row in table if row[2]] == []
    assert _all_clustertool_resources(aws) == 0


def test_ctrl_c_while_writing_the_hostfile_rolls_everything_back(aws, monkeypatch):
    from clustertool.cluster import lifecycle
    from clustertool.core import state

    def interrupted(cluster):
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle, "write_hostfile", interrupted)
    name = unique("hf")
    code, _, err = aws.ct(*UP, "--name", name)
    assert code == 130, err
    assert not state.exists(name)
    assert aws.total_leaks(name) == 0


def test_failed_rollback_keeps_state_and_down_finishes(aws):
    """The run fails at RunInstances' successor and the rollback's TerminateInstances fails
    too: the state is kept, the error says to run down, and down leaves nothing."""
    from clustertool.core import state

    name = unique("rb")
    aws.faults.add("create_tags", RuntimeError("injected"))
    aws.faults.add("terminate_instances", client_error("InternalError", "TerminateInstances", "try later"))
    code, _, err = aws.ct(*UP, "--name", name)
    assert code != 0 and "cleanup failed too" in err and f"clustertool down -c {name}" in err
    assert state.exists(name) and aws.leaks(name)["instances"] == 2
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_down_interrupted_at_each_step_then_run_again_leaves_nothing(aws):
    """Ctrl-C at every AWS call of `down` (after the call ran); a second `down` finishes."""
    from clustertool.core import state
    from clustertool.providers.aws import client

    name = unique("drec")
    assert aws.ct(*UP, "--name", name)[0] == 0
    start = len(aws.recorder.ops)
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    down_ops = aws.recorder.ops[start:]
    removals = {"terminate_instances", "delete_security_group", "delete_placement_group", "delete_key_pair"}
    assert removals <= set(down_ops)
    done = []
    for index, op in _steps(down_ops):
        name = unique("d")
        assert aws.ct(*UP, "--name", name)[0] == 0
        fault = AtCall(index, KeyboardInterrupt(), after=True)
        client.HOOKS.insert(1, fault)
        try:
            code, _, err = aws.ct("down", "-c", name, "--yes")
        finally:
            client.HOOKS.remove(fault)
        assert fault.fired == op and code == 130 and "Traceback" not in err
        assert state.exists(name)  # an interrupted down keeps the state, so it can be run again
        code, _, err = aws.ct("down", "-c", name, "--yes")
        assert code == 0, f"second down after Ctrl-C at {op}: {err}"
        assert aws.total_leaks(name) == 0, (op, aws.leaks(name))
        done.append(f"ctrl-c in down after call {index} ({op}), then down again: 0 leaked")
    print("\n".join(done))  # after the loop: ct() reads captured output away
    assert _all_clustertool_resources(aws) == 0
