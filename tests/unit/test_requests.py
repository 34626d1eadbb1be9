"""Every command's request checks itself once, when it is made: a bad value is one UsageError line that
names the flag the user typed (or says what is missing), before any cluster is looked at."""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest

from clustertool.bench.benchrequests import AllreduceBenchRequest
from clustertool.cluster.clusterrequests import ReplaceRequest
from clustertool.core.errors import UsageError
from clustertool.doctor.doctorrequests import DoctorRequest
from clustertool.jobs.jobrequests import (
    DEFAULT_REPLACE_WAIT_S,
    HangPolicy,
    KillRequest,
    LogsRequest,
    RecoverRequest,
    RestartPolicy,
    RunRequest,
    StacksRequest,
    parse_exit_codes,
)
from clustertool.remote.remoterequests import ExecRequest
from clustertool.transfer.transferrequests import CopyRequest, SyncS3Request

pytestmark = pytest.mark.unit

BAD: list[tuple[str, Callable[[], object], str]] = [
    ("run --restarts -1", lambda: RunRequest.of("x", restarts=-1), "--restarts -1: give 0 or more"),
    ("run codes without restarts", lambda: RunRequest.of("x", restart_on_exit_codes=[137]),
     "--restart-on-exit-codes goes with --restarts N"),
    ("run code 0", lambda: RunRequest.of("x", restarts=2, restart_on_exit_codes=[0]),
     "--restart-on-exit-codes: 0 is not an exit code"),
    ("run codes text", lambda: parse_exit_codes("1;137"), "--restart-on-exit-codes '1;137'"),
    ("run --hang-timeout", lambda: RunRequest.of("x", hang_timeout=0.5), "--hang-timeout 0.5s is too short"),
    ("run --hang-action", lambda: RunRequest.of("x", hang_timeout=60, hang_action="stop"), "--hang-action 'stop'"),
    ("run kill alone", lambda: RunRequest.of("x", hang_action="kill"), "--hang-action kill goes with --hang-timeout"),
    ("run --replace-failed", lambda: RunRequest.of("x", replace_failed=True),
     "--replace-failed goes with --restarts N"),
    ("run --replace-wait alone", lambda: RunRequest.of("x", restarts=1, replace_wait=60),
     "--replace-wait goes with --replace-failed"),
    ("run --replace-wait short", lambda: RunRequest.of("x", restarts=1, replace_failed=True, replace_wait=2),
     "--replace-wait 2s is too short"),
    ("run --on-preempt-signal", lambda: RunRequest.of("x", on_preempt_signal="KILLME"),
     "--on-preempt-signal 'KILLME'"),
    ("run --sync-to alone", lambda: RunRequest.of("x", sync_to="/p"), "--sync-to goes with --sync"),
    ("run --sync missing", lambda: RunRequest.of("x", sync="/no/such/folder"), "--sync '/no/such/folder'"),
    ("run --sync-to relative", lambda: RunRequest.of("x", sync=True, sync_to="rel"), "--sync-to 'rel'"),
    ("run --horovod-fusion-mb", lambda: RunRequest.of("x", fusion_mb=-1), "--horovod-fusion-mb must be 0 or more"),
    ("run --horovod-cycle-ms", lambda: RunRequest.of("x", cycle_ms=0), "--horovod-cycle-ms must be positive"),
    ("run --np", lambda: RunRequest.of("x", np=0), "--np must be at least 1"),
    ("run --per-node", lambda: RunRequest.of("x", per_node=0), "--per-node must be at least 1"),
    ("run no command", lambda: RunRequest.of([]), "no command given"),
    ("copy --from", lambda: CopyRequest("a", "b", source="nodes"), "--from must be leader or local"),
    ("copy --verify-only", lambda: CopyRequest("a", "b", verify=False, verify_only=True),
     "--verify-only and --no-verify"),
    ("copy --strategy", lambda: CopyRequest("a", "b", strategy="ring"), "--strategy 'ring': use auto, chain or fanout"),
    ("sync-s3 url", lambda: SyncS3Request("http://b/p", "d"), "not an S3 URL"),
    ("sync-s3 --threads", lambda: SyncS3Request("s3://b/p", "d", threads=0), "--threads 0"),
    ("sync-s3 --url-expiry", lambda: SyncS3Request("s3://b/p", "d", url_expiry=0), "--url-expiry 0"),
    ("doctor --threshold", lambda: DoctorRequest.of(threshold=1.5), "--threshold 1.5 is not between 0 and 1"),
    ("doctor --check", lambda: DoctorRequest.of(["reach,meshh"]), "unknown check 'meshh'"),
    ("doctor --bisect", lambda: DoctorRequest.of(["disk"], bisect=True), "--bisect runs the network search alone"),
    ("doctor --deep-level", lambda: DoctorRequest.of(deep=7), "--deep-level 7"),
    ("doctor --gpu-timeout", lambda: DoctorRequest.of(gpu_timeout=0), "--gpu-timeout and --deep-timeout"),
    ("doctor --since", lambda: DoctorRequest.of(since="yesterday"), "--since 'yesterday'"),
    ("bench --sizes", lambda: AllreduceBenchRequest.of(sizes="lots"), "--sizes 'lots': not a size"),
    ("bench --sizes order", lambda: AllreduceBenchRequest.of(sizes="4M:1M"), "--sizes '4M:1M'"),
    ("bench --algo", lambda: AllreduceBenchRequest.of(algo="ring,fast"), "--algo: unknown fast"),
    ("bench --dtype", lambda: AllreduceBenchRequest.of(dtype="fp8"), "--dtype 'fp8' unknown"),
    ("bench --op", lambda: AllreduceBenchRequest.of(op="avg"), "--op 'avg' unknown"),
    ("bench --iters", lambda: AllreduceBenchRequest.of(iters=0), "--iters must be >= 1"),
    ("bench --request", lambda: AllreduceBenchRequest.of(request_size="big"), "--request 'big': not a size"),
    ("bench --depth", lambda: AllreduceBenchRequest.of(depth=0), "--request must be >= 1 byte and --depth 1..1024"),
    ("replace nodes", lambda: ReplaceRequest(" "), "no node given"),
    ("replace --copy", lambda: ReplaceRequest("node-3", copy=("",)), "--copy: an empty path"),
    ("exec no command", lambda: ExecRequest(("--",)), "no command given"),
    ("logs --rank", lambda: LogsRequest("j1", ranks="0-x"), "--rank '0-x'"),
    ("logs --tail", lambda: LogsRequest("j1", tail=-1), "--tail -1"),
    ("logs --attempt -f", lambda: LogsRequest("j1", follow=True, attempt=1), "--attempt shows one attempt as it is"),
    ("kill --grace", lambda: KillRequest("j1", grace=-1), "--grace -1: give 0 or more seconds"),
    ("stacks --timeout", lambda: StacksRequest("j1", timeout=0), "--timeout 0"),
    ("recover --poll", lambda: RecoverRequest("j1", poll=0), "--poll 0"),
    ("recover --copy", lambda: RecoverRequest(copy=(" ",)), "--copy: an empty path"),
    ("exec --timeout", lambda: ExecRequest.of("hostname", timeout=0), "--timeout 0: give seconds above 0"),
]


@pytest.mark.parametrize("make, words", [(m, w) for _, m, w in BAD], ids=[i for i, _, _ in BAD])
def test_a_bad_value_is_one_usage_error_line_naming_the_flag(make, words):
    with pytest.raises(UsageError) as info:
        make()
    assert info.value.message.startswith(words) or words in info.value.message, info.value.message
    assert "\n" not in info.value.message and "\n" not in (info.value.hint or "")


def test_a_request_is_normalised_once_so_equal_asks_are_equal_requests(tmp_path):
    assert RunRequest.of("x", restarts=2, restart_on_exit_codes=[137, 1, 1]).restarts == RestartPolicy(2, (1, 137))
    asked = RunRequest.of("x", restarts=1, replace_failed=True, on_preempt_signal="sigusr1").recovery
    assert (asked.on_preempt_signal, asked.wait_s) == ("USR1", DEFAULT_REPLACE_WAIT_S)
    assert RunRequest.of("x").recovery.wait_s is None
    assert RunRequest.of("x", sync=True).sync == RunRequest.of("x", sync=".").sync
    assert RunRequest.of("x", env={"A": 1}) == RunRequest.of("x", env=["A=1"])
    assert CopyRequest("a", "b", cipher="") == CopyRequest("a", "b", cipher=None)
    assert DoctorRequest.of(["mesh"], ["disk"]).checks == ("ssh-mesh",)
    assert DoctorRequest.of(bisect=True).checks == ("network",)
    assert AllreduceBenchRequest.of(algo="ring, mpi") == AllreduceBenchRequest.of(algo=["ring", "mpi"])
    assert ExecRequest(("--", "hostname")) == ExecRequest.of("hostname")


def test_a_request_cannot_be_changed_into_a_bad_one():
    request = RunRequest.of("x", hang_timeout=60, hang_action="kill")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.hang = HangPolicy()  # type: ignore[misc]
    with pytest.raises(UsageError, match="--hang-action kill goes with --hang-timeout"):
        dataclasses.replace(request, hang=dataclasses.replace(request.hang, timeout=None))


def test_the_job_record_is_derived_from_the_request_and_the_plan(ct_env):
    from clustertool.jobs import launch
    from clustertool.jobs.jobplan import plan_job
    from tests.fakes.cluster import saved_cluster

    record = saved_cluster("rq", 2)
    request = RunRequest.of(["python", "t.py"], name="train", hang_timeout=600, hang_action="kill", restarts=2,
                            restart_on_exit_codes=[137], replace_failed=True)
    plan = plan_job(record, record.schedulable, request.mpi_options(), "j1")
    job = launch.job_record(record, plan, request, "TERM")
    assert (job.name, job.hang_timeout, job.hang_action, job.restarts, job.restart_on_exit_codes) == (
        "train", 600, "kill", 2, [137])
    assert (job.replace_failed, job.replace_wait, job.on_preempt_signal) == (True, DEFAULT_REPLACE_WAIT_S, "TERM")
    assert (job.command, job.nodes, job.np, job.argv) == (["python", "t.py"], ["node-1", "node-2"], plan.np,
                                                          plan.argv)
