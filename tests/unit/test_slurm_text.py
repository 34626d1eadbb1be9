"""The parsers of Slurm's text formats, fed output of Slurm 22.05 (recorded) and of 21.08 and 23.11
(derived from SchedMD's source: tests/unit/data/slurm/README.md says how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertool.slurm import SlurmError, slurmtext
from clustertool.slurm.slurmconf import NodeSize

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parent / "data" / "slurm"
RELEASES = {"21.08": DATA / "21.08-derived", "22.05": DATA / "22.05-recorded", "23.11": DATA / "23.11-derived"}
VERSIONS = {"21.08": (21, 8, 8), "22.05": (22, 5, 8), "23.11": (23, 11, 11)}


def read(release: str, name: str) -> str:
    return (RELEASES[release] / name).read_text()


@pytest.fixture(params=sorted(RELEASES))
def release(request) -> str:
    return request.param


def test_slurmd_C_and_V_give_the_size_and_the_release(release):
    assert slurmtext.node_size(read(release, "slurmd-C.out")) == NodeSize(2, 1, 1, 2, 1, 24105)
    assert slurmtext.version(read(release, "slurmd-V.out")) == VERSIONS[release]


def test_sinfo_shows_a_draining_node_with_its_reason_while_the_others_run_a_job(release):
    nodes = {n.name: n for n in slurmtext.sinfo_nodes(read(release, "sinfo-busy-draining.out"))}
    assert sorted(nodes) == ["node-1", "node-2", "node-3"]
    assert (nodes["node-1"].state, nodes["node-1"].reason, nodes["node-1"].idle) == ("allocated", "none", False)
    assert (nodes["node-3"].state, nodes["node-3"].reason) == ("draining", "Xid 79 on GPU 1")
    assert nodes["node-3"].partition == "workers" and nodes["node-3"].default_partition
    assert (nodes["node-3"].gres, nodes["node-3"].cpus, nodes["node-3"].memory) == ("gpu:2", 2, 24105)


def test_sinfo_tells_idle_from_drained_and_from_not_responding(release):
    drained = {n.name: n for n in slurmtext.sinfo_nodes(read(release, "sinfo-drained.out"))}
    assert drained["node-1"].idle and not drained["node-3"].idle and drained["node-3"].state == "drained"
    resumed = {n.name: n for n in slurmtext.sinfo_nodes(read(release, "sinfo-resumed.out"))}
    assert (resumed["node-3"].state, resumed["node-3"].flags, resumed["node-3"].idle) == ("idle", "*", False)
    assert all(n.idle for n in slurmtext.sinfo_nodes(read(release, "sinfo-idle.out")))


def test_squeue_gives_each_pending_job_its_reason_and_keeps_a_name_with_a_bar(release):
    jobs = {j.id: j for j in slurmtext.squeue_jobs(read(release, "squeue-queue.out"))}
    assert {i: (j.state, j.reason) for i, j in jobs.items()} == {
        "2": ("RUNNING", "None"), "3": ("PENDING", "Resources"), "4": ("PENDING", "Priority"),
        "5": ("PENDING", "Dependency"), "6": ("PENDING", "ReqNodeNotAvail, UnavailableNodes:node-3")}
    assert (jobs["2"].nodelist, jobs["2"].nodes, jobs["2"].user, jobs["2"].name) == ("node-[1-3]", 3, "root", "train-a")
    assert jobs["3"].name == "train b|x" and jobs["3"].pending and jobs["3"].nodelist == ""
    assert jobs["3"].started == "N/A" and jobs["2"].started == "2026-11-28T00:46:07"


def test_scontrol_show_node_reads_every_node_its_state_and_a_drain_reason_with_its_author(release):
    busy = [slurmtext.node_info(r) for r in slurmtext.records(read(release, "scontrol-show-node-busy.out"))]
    assert [(n.name, n.state, n.drained) for n in busy] == [
        ("node-1", "allocated", False), ("node-2", "allocated", False), ("node-3", "allocated+drain", True)]
    assert busy[2].reason == "Xid 79 on GPU 1 [root@2026-11-28T00:46:07]"
    assert (busy[0].gres, busy[0].address, busy[0].version, busy[0].partitions) == (
        "gpu:2", "10.213.0.1", "22.05.8", "workers")
    records = slurmtext.records(read(release, "scontrol-show-node-drained.out"))
    assert len(records) == 1 and records[0]["State"] == "IDLE+DRAIN"
    assert records[0]["OS"] == "Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0"  # a value with spaces and a '#'
    assert records[0]["RealMemory"] == "24105" and records[0]["CPUTot"] == "2"


@pytest.mark.parametrize("name, state, reason, code, nodes", [
    ("running", "RUNNING", "None", (0, 0), "node-[1-3]"),
    ("completed", "COMPLETED", "None", (0, 0), "node-[1-3]"),
    ("pending-resources", "PENDING", "Resources", (0, 0), ""),
    ("pending-reqnodenotavail", "PENDING", "ReqNodeNotAvail,_UnavailableNodes:node-3", (0, 0), ""),
    ("cancelled", "CANCELLED", "ReqNodeNotAvail,_UnavailableNodes:node-3", (0, 0), ""),
    ("failed", "FAILED", "NonZeroExitCode", (3, 0), "node-[1-2]"),
    ("signaled", "FAILED", "JobLaunchFailure", (0, 9), "node-1"),
])
def test_scontrol_show_job_gives_the_state_reason_exit_code_and_nodes(release, name, state, reason, code, nodes):
    [record] = slurmtext.records(read(release, f"scontrol-show-job-{name}.out"))
    job = slurmtext.job_info(record)
    assert (job.state, job.reason, (job.exit_code, job.signal), job.nodelist) == (state, reason, code, nodes)
    assert job.user == "root" and job.restarts == 0 and job.workdir == "/root"
    assert job.stdout.startswith("/root/") and job.stdout == job.stderr


def test_a_running_job_names_its_batch_host_and_output_file(release):
    job = slurmtext.job_info(slurmtext.records(read(release, "scontrol-show-job-running.out"))[0])
    assert (job.id, job.name, job.batch_host, job.stdout) == ("2", "train-a", "node-1", "/root/a-2.out")


def test_sacct_gives_final_states_exit_codes_and_who_cancelled(release):
    path = DATA / f"{release}-derived" / "sacct.out"
    jobs = {j.id: j for j in slurmtext.sacct_jobs(path.read_text())}
    assert (jobs["6"].state, jobs["6"].cancelled_by, jobs["6"].nodelist) == ("CANCELLED", "0", "None assigned")
    assert (jobs["7"].state, jobs["7"].exit_code, jobs["8"].signal) == ("FAILED", 3, 9)
    assert jobs["3"].name == "train b|x" and jobs["2"].nodes == 3


def test_the_controllers_jobcomp_log_keeps_every_finished_job():
    jobs = {j.id: j for j in slurmtext.jobcomp_jobs(read("22.05", "jobcomp.log"))}
    assert {i: (j.state, j.exit_code, j.signal) for i, j in jobs.items()} == {
        "1": ("COMPLETED", 0, 0), "2": ("COMPLETED", 0, 0), "3": ("COMPLETED", 0, 0), "4": ("COMPLETED", 0, 0),
        "5": ("COMPLETED", 0, 0), "6": ("CANCELLED", 0, 0), "7": ("FAILED", 3, 0), "8": ("FAILED", 0, 9)}
    assert jobs["3"].name == "train b|x" and jobs["2"].nodelist == "node-[1-3]" and jobs["7"].workdir == "/root"


def test_what_22_05_lacks_is_recorded_as_such():
    assert "unrecognized option '--json'" in read("22.05", "scontrol-json.out")
    assert read("22.05", "sacct-no-accounting.out").startswith("Slurm accounting storage is disabled")


def test_states_split_into_word_and_flags():
    assert slurmtext.split_state("drained*") == ("drained", "*")
    assert slurmtext.split_state("IDLE~") == ("idle", "~")
    assert slurmtext.split_state("mixed") == ("mixed", "")
    assert slurmtext.split_state("DOWN*+DRAIN") == ("down*+drain", "")


def test_text_that_is_not_the_asked_format_is_an_error_not_a_guess():
    with pytest.raises(SlurmError, match="not sinfo's format"):
        slurmtext.sinfo_nodes("NODELIST   NODES PARTITION STATE\nnode-1 1 workers* idle\n")
    with pytest.raises(SlurmError, match="not what slurmd -C prints"):
        slurmtext.node_size("slurmd: error: Unable to initialize\n")
    with pytest.raises(SlurmError):
        slurmtext.exit_code("x:y")

