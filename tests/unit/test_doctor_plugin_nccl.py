"""doctor's `plugin-nccl` check: skipped without GPUs or a deploy; on GPU clusters `plugin check`'s
problems become findings with their fixes.

The nodes' answers are scripted and the NCCL run is recorded log text (no GPU here, so NCCL
cannot run); the CPU cluster's skip also runs for real in tests/local/test_plugin_local.py.
"""

from __future__ import annotations

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.doctor import checkup, plugin_check
from clustertool.doctor.doctorrequests import DoctorRequest
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Reply, ScriptedTransport
from tests.unit.test_nccl_log import LOG_2_26, info
from tests.unit.test_plugin_check import DEST, SUMS, deployed, job_output, sums_text

pytestmark = pytest.mark.unit

MB = 1 << 20


def facts(gpus: str) -> Reply:
    return Reply(f"nproc=8\ngpus={gpus}\nmpi=mpirun (Open MPI) 4.1.4\nplugin=absent\niperf3=yes\n")


@pytest.fixture
def fake(tmp_path, ct_env):
    saved_cluster("dn", 2)
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: c.command == "true", Reply())
    fake.on(lambda c: 'echo "J $j' in (c.stdin or ""), Reply(""))  # the leader knows no running job
    fake.on(lambda c: "sha256sum" in c.command and DEST in c.command, Reply(sums_text(SUMS)))
    fake.on("nccl_gpu_worker.py", Reply("python=/usr/bin/python3\n"))
    return fake


def recorded(monkeypatch, logs: list[str]):
    """What NCCL would have printed: the launch returns this output instead of starting mpirun."""
    out = job_output(logs, [[(MB, 300.0, 0)]] * len(logs))
    monkeypatch.setattr(plugin_check, "_default_launch", lambda cluster, timeout, on_line: (
        lambda env, argv, plugin, per_node: (0, out, None)))


def plugin_nccl(result):
    return next(c for c in result.checks if c.name == "plugin-nccl")


def test_cpu_cluster_skips_with_no_gpu(fake):
    deployed("dn")
    fake.on("nproc=", facts("none"))
    c = plugin_nccl(checkup.run(ClusterSession.load("dn", transport=fake),
                               DoctorRequest(checks=("reach", "plugin-nccl"))))
    assert (c.status, c.skipped, c.findings) == ("skipped", "no GPU", [])


def test_gpu_cluster_without_a_deploy_skips(fake):
    fake.on("nproc=", facts("1"))
    c = plugin_nccl(checkup.run(ClusterSession.load("dn", transport=fake), DoctorRequest(checks=("plugin-nccl",))))
    assert c.skipped == "plugin not deployed"


def test_nccl_on_its_own_net_is_an_error_finding_with_the_fix(fake, monkeypatch):
    deployed("dn")
    fake.on("nproc=", facts("1"))
    log = "\n".join([info("NCCL version 2.28.9+cuda12.9"),
                     info("NET/Plugin: Could not find: libnccl-net-clustertool.so libnccl-net-clustertool.so"),
                     info("Using network Socket")])
    recorded(monkeypatch, [log, log])
    result = checkup.run(ClusterSession.load("dn", transport=fake), DoctorRequest(checks=("plugin-nccl",)))
    c = plugin_nccl(result)
    assert c.status == "error" and result.exit_code == 1
    summary, problem = c.findings
    assert summary.severity == "info" and summary.message.startswith("NCCL 2.28.9 on Socket; CollNet off")
    assert problem.severity == "error" and "did not load the clustertool plugin" in problem.message
    assert "NCCL_NET_PLUGIN=clustertool" in problem.fix and "LD_LIBRARY_PATH" in problem.fix


def test_plugin_loaded_with_collnet_is_clean_and_names_the_algorithm(fake, monkeypatch):
    deployed("dn")
    fake.on("nproc=", facts("1"))
    recorded(monkeypatch, [LOG_2_26, LOG_2_26])
    result = checkup.run(ClusterSession.load("dn", transport=fake), DoctorRequest(checks=("plugin-nccl",)))
    assert result.clean and plugin_nccl(result).status == "ok"
    assert plugin_nccl(result).findings[0].message == (
        "NCCL 2.26.6 on clustertool (plugin ABI v10); CollNet on; allreduce 1M COLLNET_CHAIN/SIMPLE; #wrong 0")


def test_a_running_job_skips_the_check_instead_of_competing_for_its_gpus(fake, monkeypatch):
    deployed("dn")
    fake.on("nproc=", facts("1"))
    monkeypatch.setattr(checkup, "running_job_ids", lambda session: {"j0712-abcdef"})
    monkeypatch.setattr(plugin_check, "_default_launch", lambda *a: pytest.fail("the check must not start a job"))
    c = plugin_nccl(checkup.run(ClusterSession.load("dn", transport=fake), DoctorRequest(checks=("plugin-nccl",))))
    assert c.skipped == "job j0712-abcdef is running"
