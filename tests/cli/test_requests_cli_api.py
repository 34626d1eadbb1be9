"""The CLI and the Python API build the same request for the same ask, and hand it to the same core
function: what a command's flags mean is written once (the request), not once per front."""

from __future__ import annotations

import pytest

from clustertool import Cluster
from clustertool.cli.app import run as cli
from clustertool.core.errors import ToolError
from tests.fakes.cluster import saved_cluster

pytestmark = pytest.mark.cli


class Seen(ToolError):
    """What the patched core function raises once it has the request: nothing runs."""


@pytest.fixture
def seen(ct_env, monkeypatch):
    """``seen(target, *also)``: patch the core function ``target`` (and the names in ``also`` bound to it) to
    keep the request it gets; returns the list the requests go to."""
    saved_cluster("x", 3)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)

    def patch(target: str, *also: str) -> list:
        got: list = []

        def core(session, request, **_kw):
            got.append(request)
            raise Seen("seen")

        for name in (target, *also):
            monkeypatch.setattr(name, core)
        return got
    return patch


def both(got: list, argv: list[str], api) -> tuple:
    """(the CLI's request, the API's request) for the same ask."""
    assert cli(argv) == 1
    with pytest.raises(Seen):
        api(Cluster.load("x"))
    assert len(got) == 2
    return got[0], got[1]


def test_run(seen, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = seen("clustertool.jobs.launch.run")
    argv = ["run", "-c", "x", "--nodes", "node-[1-2]", "--np", "2", "--per-node", "1", "-x", "A=1", "-x", "HOME",
            "--mpi-arg=--bind-to", "--mpi-arg=none", "--plugin", "--horovod-fusion-mb", "64", "--horovod-autotune",
            "--nccl-debug", "INFO", "--sync", "--sync-to", "/scratch/p", "--name", "train", "--allow-concurrent",
            "--no-tag-output", "--launcher", "torchrun", "--hang-timeout", "10m", "--hang-action", "kill",
            "--restarts", "2", "--restart-on-exit-codes", "137,1", "--replace-failed", "--replace-wait", "15m",
            "--on-preempt-signal", "usr1", "--", "python", "t.py"]
    cli_request, api_request = both(got, argv, lambda c: c.run(
        ["python", "t.py"], nodes="node-[1-2]", np=2, per_node=1, env=["A=1", "HOME"],
        mpi_args=["--bind-to", "none"], plugin=True, fusion_mb=64, autotune=True, nccl_debug="INFO", sync=True,
        sync_to="/scratch/p", name="train", allow_concurrent=True, tag_output=False, launcher="torchrun",
        hang_timeout=600, hang_action="kill", restarts=2, restart_on_exit_codes=[1, 137], replace_failed=True,
        replace_wait=900, on_preempt_signal="USR1"))
    assert cli_request == api_request
    assert cli_request.restarts.exit_codes == (1, 137) and cli_request.recovery.replace_wait == 900
    assert cli_request.sync.target() == (str(tmp_path), "/scratch/p")


def test_run_dry_run_is_the_same_request_planned(seen):
    got = seen("clustertool.jobs.launch.run")
    cli_request, api_request = both(got, ["run", "-c", "x", "--dry-run", "--", "hostname"],
                                    lambda c: c.plan_run("hostname"))
    assert cli_request == api_request


def test_copy_and_sync_s3(seen):
    got = seen("clustertool.transfer.copy.copy")
    argv = ["copy", "-c", "x", "-n", "node-2", "--from", "local", "--strategy", "chain", "--no-verify", "--delete",
            "--cipher", "", "/src", "/dest"]
    cli_request, api_request = both(got, argv, lambda c: c.copy("/src", "/dest", nodes="node-2", source="local",
                                                                strategy="chain", verify=False, delete=True,
                                                                cipher=None))
    assert cli_request == api_request
    got = seen("clustertool.transfer.s3.sync_s3")
    argv = ["sync-s3", "-c", "x", "s3://b/ds", "data", "--shard", "--threads", "4", "--url-expiry", "30m",
            "--recheck", "--region", "eu-west-1", "-n", "workers"]
    cli_request, api_request = both(got, argv, lambda c: c.sync_s3("s3://b/ds", "data", shard=True, threads=4,
                                                                   url_expiry=1800, recheck=True,
                                                                   region="eu-west-1", nodes="workers"))
    assert cli_request == api_request


def test_doctor(seen):
    got = seen("clustertool.doctor.checkup.run")
    argv = ["doctor", "-c", "x", "--check", "disk,clock", "--check", "mesh", "--skip", "clock", "--fix", "--cordon",
            "--threshold", "0.7", "--all-pairs", "--deep", "--deep-level", "1", "--since", "2h", "--gpu-timeout",
            "30", "--nccl-log", "j1", "--disk-path", "/data"]
    cli_request, api_request = both(got, argv, lambda c: c.doctor(
        ["disk,clock", "mesh"], skip="clock", fix=True, cordon=True, threshold=0.7, all_pairs=True, deep=1,
        since="2h", gpu_timeout=30, nccl_log="j1", disk_paths=["/data"]))
    assert cli_request == api_request and cli_request.checks == ("ssh-mesh", "disk")
    got.clear()
    cli_request, api_request = both(got, ["doctor", "-c", "x", "--bisect", "--threshold", "0.6"],
                                    lambda c: c.bisect(threshold=0.6))
    assert cli_request == api_request and cli_request.checks == ("network",)


def test_exec_replace_and_bench_allreduce(seen, tmp_path):
    got = seen("clustertool.remote.execute.execute", "clustertool.api.execute")
    cli_request, api_request = both(got, ["exec", "-c", "x", "-n", "node-2", "--timeout", "5", "--", "hostname"],
                                    lambda c: c.exec("hostname", nodes="node-2", timeout=5))
    assert cli_request == api_request
    got = seen("clustertool.transfer.refill.replace_and_refill", "clustertool.api.replace_and_refill")
    argv = ["replace", "-c", "x", "node-2", "node-3", "--copy", "data", "--keep-old", "--yes"]
    cli_request, api_request = both(got, argv, lambda c: c.replace(["node-2", "node-3"], copy=["data"],
                                                                   keep_old=True))
    assert cli_request == api_request and cli_request.nodes == "node-2,node-3"
    got = seen("clustertool.bench.allreducerun.run_allreduce", "clustertool.api.run_allreduce")
    table = str(tmp_path / "t.csv")
    argv = ["bench", "allreduce", "-c", "x", "--sizes", "1M:4M", "--algo", "ring,mpi", "--dtype", "half", "--op",
            "max", "-n", "3", "-w", "0", "--ifname", "eth1", "-x", "A=1", "--timeout", "60", "--tuner-csv", table]
    cli_request, api_request = both(got, argv, lambda c: c.bench_allreduce(
        sizes="1M:4M", algo=["ring", "mpi"], dtype="half", op="max", iters=3, warmup=0, ifname="eth1",
        env=["A=1"], timeout=60, tuner_csv=table))
    assert cli_request == api_request and (cli_request.request_bytes, cli_request.depth) == (256 << 10, 8)
    got.clear()
    cli_request, api_request = both(got, ["bench", "allreduce", "-c", "x", "--request", "1M", "--depth", "4"],
                                    lambda c: c.bench_allreduce(request_size="1M", depth=4))
    assert cli_request == api_request and (cli_request.request_bytes, cli_request.depth) == (1 << 20, 4)
    got.clear()
    cli_request, api_request = both(got, ["bench", "allreduce", "-c", "x", "--one-request"],
                                    lambda c: c.bench_allreduce(one_request=True))
    assert cli_request == api_request and cli_request.one_request


def test_kill_stacks_and_recover(seen):
    got = seen("clustertool.jobs.kill.run")
    cli_request, api_request = both(got, ["kill", "-c", "x", "--signal", "INT", "--grace", "3", "j1"],
                                    lambda c: c.kill("j1", signal="INT", grace=3))
    assert cli_request == api_request
    got.clear()
    cli_request, api_request = both(got, ["kill", "-c", "x", "--all-python", "-n", "members"],
                                    lambda c: c.kill(all_python=True, nodes="members"))
    assert cli_request == api_request
    got = seen("clustertool.jobs.stacks.stacks")
    cli_request, api_request = both(got, ["stacks", "-c", "x", "--no-py-spy", "--timeout", "5", "j1"],
                                    lambda c: c.stacks("j1", py_spy=False, timeout=5))
    assert cli_request == api_request
    got = seen("clustertool.jobs.recovery.recover")
    cli_request, api_request = both(got, ["recover", "-c", "x", "j1", "--copy", "data", "--poll", "1"],
                                    lambda c: c.recover("j1", copy=["data"], poll=1))
    assert cli_request == api_request
