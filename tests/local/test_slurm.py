"""Slurm on a real 3-node local cluster: `clustertool up`, then clustertool.slurm.bringup.setup with the
cluster's session (phase A of issue 34: `up --scheduler slurm` will call it). Real slurmctld, slurmd and
munged (Debian's 22.05) inside the nodes' namespaces, one munged per node with the cluster's own key and
socket (never this machine's /etc/munge); 2 stand-in GPUs per node (character devices in each node's own
/dev, no driver behind them) as GRES. Then: a 2-node batch job's output and exit code, two jobs that
queue and both succeed, a drain and a resume seen in sinfo (a drained node gets no work), a failing job's
exit code; `down` leaves no slurmd, slurmctld or munged (tests/local/conftest.py's leftover check)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.slurm import bringup, munge, slurmcmd, slurmtext
from clustertool.slurm.slurmconf import SlurmSettings
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local

PROGRAMS = ("slurmd", "slurmctld", "sbatch", "srun", "sinfo", "squeue", "scontrol", "munged", "munge")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
GPUS = 2


def _slurm_missing() -> str | None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [p for p in PROGRAMS if not shutil.which(p, path=path)]
    return f"Slurm is not installed ({', '.join(missing)} missing): `make apt` installs Debian's " \
           "slurmd slurmctld slurm-client munge" if missing else None


@dataclass
class Case:
    name: str
    session: ClusterSession
    settings: SlurmSettings
    key: bytes


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = _slurm_missing()
    if reason:
        pytest.skip(reason)
    clusters = module_cluster(tmp_path_factory, 3, "sl")
    name, env = next(clusters)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLUSTERTOOL_HOME", env["CLUSTERTOOL_HOME"])
        session = ClusterSession.load(name)
        key = munge.ensure_key(state.ClusterPaths(name).root)
        try:
            settings = bringup.setup(session, key, standin_gpus=GPUS)
            yield Case(name, session, settings, key)
        finally:
            next(clusters, None)  # down, then the leftover check (slurmd, slurmctld, munged included)


def slurm_cmd(case: Case, argv: list[str], node: str = "node-1", timeout: float = 60) -> str:
    result = bringup.run_slurm(case.session, case.session.record.node(node), case.settings.layout, argv, timeout)
    assert result.ok, f"{argv}: {result.reason}"
    return result.stdout


def sbatch(case: Case, **spec) -> str:
    return slurm_cmd(case, slurmcmd.sbatch_argv(slurmcmd.BatchSpec(**spec))).strip().split(";")[0]


def job(case: Case, job_id: str) -> slurmtext.JobInfo:
    [record] = slurmtext.records(slurm_cmd(case, slurmcmd.show_argv("job", job_id)))
    return slurmtext.job_info(record)


def wait_job(case: Case, job_id: str, until, timeout: float = 90) -> slurmtext.JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = job(case, job_id)
        if until(info):
            return info
        assert time.monotonic() < deadline, f"job {job_id} stayed {info.state} ({info.reason})"
        time.sleep(0.2)


def finished(case: Case, job_id: str) -> slurmtext.JobInfo:
    return wait_job(case, job_id, lambda j: j.state in FINAL)


def nodes(case: Case) -> dict[str, slurmtext.SinfoNode]:
    return {n.name: n for n in slurmtext.sinfo_nodes(slurm_cmd(case, slurmcmd.sinfo_nodes_argv()))}


def read_on(case: Case, node: str, path: str) -> str:
    result = run_on_node(case.session, case.session.record.node(node), f"cat {path}", timeout=30)
    assert result.ok, result.reason
    return result.stdout


def test_every_node_is_idle_with_its_stand_in_gpus_and_srun_reaches_all(slurm):
    seen = nodes(slurm)
    assert sorted(seen) == ["node-1", "node-2", "node-3"]
    assert all(n.idle and n.gres == f"gpu:{GPUS}" and n.partition == "workers" for n in seen.values()), seen
    argv = slurmcmd.srun_argv(slurmcmd.StepSpec(command=["sh", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES"],
                                                nodes=3, extra=[f"--gres=gpu:{GPUS}"]))
    assert sorted(slurm_cmd(slurm, argv).splitlines()) == ["node-1 0,1", "node-2 0,1", "node-3 0,1"]
    devices = run_on_nodes(slurm.session, slurm.session.nodes, "stat -c '%F %t:%T' /dev/nvidia0 /dev/nvidia1")
    assert {r.stdout for r in devices.results} == {"character special file c3:0\ncharacter special file c3:1\n"}
    assert not os.path.exists("/dev/nvidia0")  # the stand-ins live in the nodes' own /dev only


def test_munge_runs_with_the_clusters_own_key_never_this_machines(slurm):
    layout = slurm.settings.layout
    for node in slurm.session.nodes:
        mode = run_on_node(slurm.session, node, f"stat -c %a {layout.munge_key}; stat -c %a {layout.run_dir}")
        assert mode.stdout.split() == ["400", "755"], (node.name, mode.stdout)
    home_key = state.ClusterPaths(slurm.name).root / "munge.key"  # made on this machine, kept with the cluster
    assert stat.S_IMODE(home_key.stat().st_mode) == 0o600 and home_key.read_bytes() == slurm.key
    if os.path.exists("/etc/munge/munge.key"):
        assert open("/etc/munge/munge.key", "rb").read() != slurm.key
    check = run_on_node(slurm.session, slurm.session.record.node("node-2"),
                        f"munge --socket {layout.munge_socket} --no-input | unmunge --socket {layout.munge_socket}")
    assert check.ok and "STATUS:          Success (0)" in check.stdout, check.stdout + check.stderr


def test_a_two_node_batch_job_writes_its_output_and_exits_0(slurm):
    job_id = sbatch(slurm, wrap="srun hostname", nodes=2, job_name="two", output="/root/two-%j.out")
    info = finished(slurm, job_id)
    assert (info.state, info.exit_code, info.signal) == ("COMPLETED", 0, 0)
    hosts = read_on(slurm, info.batch_host, info.stdout).split()
    assert len(hosts) == 2 and len(set(hosts)) == 2 and set(hosts) <= {"node-1", "node-2", "node-3"}


def test_a_second_job_waits_for_the_first_and_both_succeed(slurm):
    hold = "while [ ! -e /tmp/release-$SLURM_JOB_ID ]; do sleep 0.2; done; srun hostname"
    first = sbatch(slurm, wrap=hold, nodes=3, job_name="first", output="/root/first-%j.out")
    running = wait_job(slurm, first, lambda j: j.state == "RUNNING")
    second = sbatch(slurm, wrap="srun hostname", nodes=2, job_name="second", output="/root/second-%j.out")
    waiting = wait_job(slurm, second, lambda j: j.reason != "None")  # once the scheduler has looked at it
    assert (waiting.state, waiting.reason in ("Resources", "Priority")) == ("PENDING", True), waiting
    queue = {j.id: j for j in slurmtext.squeue_jobs(slurm_cmd(slurm, slurmcmd.squeue_argv([first, second])))}
    assert (queue[first].state, queue[second].state, queue[second].user) == ("RUNNING", "PENDING", "root")
    release = run_on_node(slurm.session, slurm.session.record.node(running.batch_host), f"touch /tmp/release-{first}")
    assert release.ok, release.reason
    for job_id, count in ((first, 3), (second, 2)):
        info = finished(slurm, job_id)
        assert (info.state, info.exit_code) == ("COMPLETED", 0), info
        assert len(set(read_on(slurm, info.batch_host, info.stdout).split())) == count


def test_a_drained_node_gets_no_work_until_it_is_resumed(slurm):
    slurm_cmd(slurm, slurmcmd.drain_argv(["node-3"], "stand-in GPU 1 fell off the bus"))
    seen = nodes(slurm)["node-3"]
    assert (seen.state, seen.reason) == ("drained", "stand-in GPU 1 fell off the bus")
    pinned = sbatch(slurm, wrap="hostname", nodes=1, nodelist=["node-3"], job_name="pinned", output="/root/p-%j.out")
    assert wait_job(slurm, pinned, lambda j: j.reason != "None").reason.startswith("ReqNodeNotAvail")
    elsewhere = sbatch(slurm, wrap="srun hostname", nodes=2, job_name="elsewhere", output="/root/e-%j.out")
    info = finished(slurm, elsewhere)
    assert sorted(read_on(slurm, info.batch_host, info.stdout).split()) == ["node-1", "node-2"]
    assert job(slurm, pinned).state == "PENDING"
    slurm_cmd(slurm, slurmcmd.resume_argv(["node-3"]))
    assert finished(slurm, pinned).state == "COMPLETED"  # the waiting job gets the node back
    deadline = time.monotonic() + 60
    while not nodes(slurm)["node-3"].idle:  # `idle*` until slurmctld hears from its slurmd again
        assert time.monotonic() < deadline, nodes(slurm)["node-3"]
        time.sleep(0.2)


def test_a_failing_job_keeps_its_exit_code_and_one_failing_rank_ends_the_step(slurm):
    # both tasks fail with 3: without --kill-on-bad-exit=0 (KillOnBadExit=1 is the cluster's), the first to end
    # stops the other, which under load may not have ended by itself yet, and srun then says 143
    failed = finished(slurm, sbatch(slurm, wrap='srun --kill-on-bad-exit=0 sh -c "exit 3"', nodes=2,
                                    output="/root/f-%j.out"))
    assert (failed.state, failed.exit_code, failed.reason) == ("FAILED", 3, "NonZeroExitCode")
    one = 'srun sh -c "[ \\$SLURM_NODEID = 1 ] && exit 7; sleep 300"'  # rank 0 would sleep past finished()'s wait
    info = finished(slurm, sbatch(slurm, wrap=one, nodes=2, output="/root/one-%j.out"))
    output = read_on(slurm, info.batch_host, info.stdout)
    assert info.state == "FAILED" and "task 1: Exited with exit code 7" in output, output
    # KillOnBadExit: srun stopped the healthy rank at once, not after its 300 s (SIGTERM: its shell reports 143, or
    # srun "Terminated"; on a loaded machine a task not yet past its start is SIGKILLed: "Killed")
    assert "Terminating StepId" in output and re.search(r"task 0: (Terminated|Killed|Exited with exit code 143)$",
                                                        output, re.M), output
