"""Issue 35 phase B, the pieces without a cluster: the controller loop's retry and lost-leader hand-off, the
kept RunRequest's round trip (a lost leader's job is planned again from it), the checkpoint warning of `run`,
the `jobs` lines that name the replacer, and `up --controller`'s request checks and dry-run plan.  The real
flows (a node and a leader replaced by the controller process) are tests/local/test_controller_recovery.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clustertool.cli.jobs import _attempt_line, _waiting_line
from clustertool.cluster.clusterrequests import UpRequest
from clustertool.cluster.spec import load_spec
from clustertool.controller import loop
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord
from clustertool.jobs import checkpoints, recoveryprep
from clustertool.jobs.jobrequests import RunRequest


class _Session:
    name = "c1"

    def __init__(self):
        self.record = SimpleNamespace(leader=SimpleNamespace(name="node-1"))

    def reload(self):
        return self.record


def _wait(job="j1", attempt=1):
    return loop.Wait(job, ("node-3",), attempt, since=1.0, until=4e9)


def test_a_handling_that_did_nothing_is_handed_again_only_after_the_retry_delay(monkeypatch):
    answers = {"now": [_wait()]}
    monkeypatch.setattr(loop, "ask_leader", lambda s: (0.0, answers["now"]))
    calls = []

    def handle(session, wait):
        calls.append(wait.job)
        if len(calls) == 1:
            return loop.Handled("failed", done=False)
        return loop.Handled("replaced")

    ctl = loop.Loop(_Session(), handle=handle)
    assert [w.job for w in ctl.round()] == ["j1"]
    assert ctl.round() == [] and calls == ["j1"]  # not before RETRY_S
    monkeypatch.setattr(loop, "RETRY_S", 0.0)
    ctl.retry_at = {k: 0.0 for k in ctl.retry_at}
    assert [w.job for w in ctl.round()] == ["j1"] and ctl.round() == [] and calls == ["j1", "j1"]
    assert [h["done"] for h in ctl.status.handled] == [False, True]


def test_an_error_in_the_handler_is_a_line_and_a_retry_not_the_end_of_the_controller(monkeypatch):
    monkeypatch.setattr(loop, "ask_leader", lambda s: (0.0, [_wait()]))

    def handle(session, wait):
        raise ToolError("replaced node-3 but could not tell the leader: timeout")

    ctl = loop.Loop(_Session(), handle=handle)
    ctl.round()
    (handled,) = ctl.status.handled
    assert handled["done"] is False and "could not tell the leader" in handled["line"]
    assert ("j1", 1) in ctl.retry_at and ("j1", 1) not in ctl.done


def test_a_leader_silent_for_the_misses_goes_to_the_lost_leader_hook_once_then_the_count_starts_again(monkeypatch):
    monkeypatch.setattr(loop, "ask_leader", lambda s: None)
    lost = []
    ctl = loop.Loop(_Session(), on_leader_lost=lambda s: lost.append(1) or "the leader was replaced")
    for _ in range(loop.LEADER_MISSES - 1):
        ctl.round()
    assert lost == []
    ctl.round()
    assert lost == [1] and ctl.status.misses == 0
    assert ctl.status.handled[-1]["line"] == "the leader was replaced"


def test_the_kept_request_gives_back_the_same_request(tmp_path):
    request = RunRequest.of(["torchrun", "train.py", "--lr", "0.1"], nodes="node-[1-3]", name="big",
                            launcher="torchrun", per_node=2, env={"A": 1}, mpi_args=["--mca", "x", "y"],
                            sync=str(tmp_path), sync_to="/srv/code", hang_timeout=60, hang_action="kill",
                            restarts=2, restart_on_exit_codes=[137, 1], replace_failed=True, replace_wait=120,
                            fusion_mb=8, checkpoint_dir="/shared/ckpt", record=False)
    assert recoveryprep.from_doc(recoveryprep.to_doc(request)) == request


def _cluster(mounts=()):
    return ClusterRecord(name="c1", provider="local", user="u",
                         provider_state={"shared_fs": [{"kind": "local", "mount": m} for m in mounts]})


def test_the_checkpoint_warning_is_one_line_only_for_restarted_jobs_off_shared_storage():
    assert checkpoints.warning(_cluster(), None, 0) is None
    assert checkpoints.warning(_cluster(), None, 1) == checkpoints.NONE
    assert "--checkpoint-dir DIR on a shared filesystem (`up --shared-fs`)" in checkpoints.NONE
    assert checkpoints.warning(_cluster(["/shared"]), "/shared/ckpt", 2) is None
    assert checkpoints.warning(_cluster(["/shared"]), "/shared", 2) is None
    off = checkpoints.warning(_cluster(["/shared"]), "/sharedx/ckpt", 2) or ""
    assert off.startswith("--checkpoint-dir /sharedx/ckpt is not on a shared filesystem (the cluster's shared "
                          "filesystems: /shared)") and "dies with it" in off
    assert "has no shared filesystem" in (checkpoints.warning(_cluster(), "/data/ckpt", 1) or "")


def test_every_rank_gets_the_checkpoint_dir_and_an_empty_one_is_refused():
    env = RunRequest.of("python t.py", restarts=1, checkpoint_dir="/shared/ckpt").mpi_options().env
    assert "CLUSTERTOOL_CHECKPOINT_DIR=/shared/ckpt" in env
    assert not any(e.startswith("CLUSTERTOOL_CHECKPOINT_DIR") for e in RunRequest.of("python t.py").mpi_options().env)
    with pytest.raises(UsageError, match="--checkpoint-dir: give a folder"):
        RunRequest.of("python t.py", checkpoint_dir=" ")


def test_jobs_names_who_replaced_a_node_and_who_will():
    line = _attempt_line({"attempt": 1, "start": 1.0, "end": 2.0, "code": None, "cause": "node-3 lost",
                          "replaced": {"nodes": ["node-3"], "by": "the controller on box"}})
    assert line.endswith("node-3 lost; node-3 replaced by the controller on box")
    assert _attempt_line({"attempt": 1, "start": 1.0, "end": 2.0, "code": 1, "cause": "node-3 lost",
                          "replaced": {"nodes": ["node-3"]}}).endswith("node-3 lost")
    assert _waiting_line({"nodes": ["node-3"], "until": 0, "replacer": "the cluster's controller"}).endswith(
        "(0s left; the cluster's controller replaces it)")
    assert _waiting_line({"nodes": ["node-3"], "until": 0}).endswith("(0s left; `clustertool recover` replaces it)")


def test_up_controller_requests_are_checked_and_the_dry_run_plan_says_it():
    spec = load_spec(None, {"provider": "local", "nodes": 2, "name": "ctl-plan"})
    with pytest.raises(UsageError, match="--controller-node: an empty node name"):
        UpRequest(spec, controller_node="")
    assert UpRequest(spec, controller_node="node-2").wants_controller and not UpRequest(spec).wants_controller
    from clustertool.cluster import lifecycle

    plan = lifecycle.up(UpRequest(spec, dry_run=True, controller=True)).plan
    assert plan[-1] == "start the recovery controller (on this machine)"
    assert "recovery controller" not in " ".join(lifecycle.up(UpRequest(spec, dry_run=True)).plan)
