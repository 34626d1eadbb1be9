"""Slurm's config files written from a cluster record, and the argv clustertool runs Slurm's programs with."""

from __future__ import annotations

import shlex

import pytest

from clustertool.core.model import ClusterRecord, Node
from clustertool.slurm import SlurmError, slurmcmd
from clustertool.slurm.layout import private_layout, system_layout
from clustertool.slurm.slurmconf import (
    NodeSize,
    Timers,
    cgroup_conf_text,
    gpu_files,
    gres_conf_text,
    settings_for,
    slurm_conf_text,
)

pytestmark = pytest.mark.unit

SIZE = NodeSize(cpus=2, boards=1, sockets_per_board=1, cores_per_socket=2, threads_per_core=1, real_memory=24105)
BIG = NodeSize(cpus=96, boards=1, sockets_per_board=2, cores_per_socket=24, threads_per_core=2, real_memory=1_000_000)


def record(n: int, servers: int = 0) -> ClusterRecord:
    nodes = [Node(f"node-{i}", i, f"10.213.4.{i}", role="leader" if i == 1 else "member") for i in range(1, n + 1)]
    nodes += [Node(f"server-{j}", n + j, f"10.213.4.{n + j}", role="server", slots=0) for j in range(1, servers + 1)]
    return ClusterRecord("team", "local", nodes=nodes)


def lines(text: str, prefix: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


def test_three_alike_local_nodes_make_one_node_line_one_partition_and_the_gpus_as_gres():
    s = settings_for(record(3), {f"node-{i}": (SIZE, 2) for i in (1, 2, 3)}, private_layout())
    conf = slurm_conf_text(s)
    assert lines(conf, "NodeName=") == [
        "NodeName=node-[1-3] NodeAddr=10.213.4.1,10.213.4.2,10.213.4.3 CPUs=2 Boards=1 SocketsPerBoard=1 "
        "CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105 Gres=gpu:2 State=UNKNOWN"]
    assert lines(conf, "PartitionName=") == [
        "PartitionName=workers Nodes=node-[1-3] Default=YES MaxTime=INFINITE State=UP"]
    assert lines(conf, "SlurmctldHost=") == ["SlurmctldHost=node-1(10.213.4.1)"]
    assert lines(conf, "ClusterName=") == ["ClusterName=team"]
    assert lines(gres_conf_text(s), "NodeName") == ["NodeName=node-[1-3] Name=gpu File=/dev/nvidia[0-1]"]


def test_a_local_node_gets_its_private_paths_and_no_cgroups():
    s = settings_for(record(2), {"node-1": (SIZE, 0), "node-2": (SIZE, 0)}, private_layout())
    conf = slurm_conf_text(s)
    assert "AuthInfo=socket=/tmp/.clustertool-slurm/munge.socket" in conf.splitlines()
    assert "StateSaveLocation=/root/.clustertool/slurm/state" in conf.splitlines()
    assert "SlurmdSpoolDir=/root/.clustertool/slurm/spool" in conf.splitlines()
    assert "ProctrackType=proctrack/linuxproc" in conf.splitlines() and "TaskPlugin=task/none" in conf.splitlines()
    assert not [ln for ln in conf.splitlines() if "/etc/" in ln or "/var/" in ln or "/run/" in ln]
    assert "CgroupPlugin=cgroup/v1" in cgroup_conf_text(s).splitlines()
    assert lines(gres_conf_text(s), "NodeName") == []  # no GPUs: no GRES lines
    assert " Gres=" not in lines(conf, "NodeName=")[0]


def test_a_machine_of_its_own_uses_the_system_paths_and_real_cgroups():
    s = settings_for(record(2), {"node-1": (BIG, 8), "node-2": (BIG, 8)}, system_layout(), cgroups=True,
                     slurm_user="slurm")
    conf = slurm_conf_text(s).splitlines()
    assert not [ln for ln in conf if ln.startswith("AuthInfo")]  # munged's default socket
    assert {"SlurmUser=slurm", "ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity",
            "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd"} <= set(conf)
    assert "ConstrainDevices=yes" in cgroup_conf_text(s).splitlines()
    assert lines(gres_conf_text(s), "NodeName") == ["NodeName=node-[1-2] Name=gpu File=/dev/nvidia[0-7]"]


def test_nodes_of_different_shapes_get_their_own_lines_with_addresses_in_hostlist_order():
    rec = record(11)
    sizes = {f"node-{i}": (SIZE, 1) for i in range(1, 12)}
    sizes["node-10"] = (NodeSize(2, 1, 1, 2, 1, 24000), 1)  # a few MiB less: same line, smallest memory
    sizes["node-3"] = (BIG, 8)
    sizes["node-7"] = (BIG, 8)
    conf = slurm_conf_text(settings_for(rec, sizes, private_layout()))
    small, big = lines(conf, "NodeName=")
    assert small.startswith("NodeName=node-[1-2,4-6,8-11] NodeAddr=10.213.4.1,10.213.4.2,10.213.4.4,10.213.4.5,"
                            "10.213.4.6,10.213.4.8,10.213.4.9,10.213.4.10,10.213.4.11 ")
    assert "RealMemory=24000 Gres=gpu:1 " in small
    assert big.startswith("NodeName=node-[3,7] NodeAddr=10.213.4.3,10.213.4.7 CPUs=96 ") and "Gres=gpu:8" in big
    assert lines(conf, "PartitionName=")[0].startswith("PartitionName=workers Nodes=node-[1-11] ")


def test_reduction_servers_are_never_slurm_nodes_and_a_leader_may_not_compute():
    rec = record(3, servers=2)
    sizes = {n.name: (SIZE, 1) for n in rec.nodes}
    conf = slurm_conf_text(settings_for(rec, sizes, private_layout()))
    assert lines(conf, "PartitionName=")[0].startswith("PartitionName=workers Nodes=node-[1-3] ")
    s = settings_for(rec, sizes, private_layout(), leader_compute=False)
    assert s.node_names == ["node-2", "node-3"] and s.controller == "node-1"
    assert lines(slurm_conf_text(s), "NodeName=")[0].startswith("NodeName=node-[2-3] NodeAddr=10.213.4.2,10.213.4.3 ")


def test_a_cluster_without_a_compute_node_or_without_a_size_is_refused():
    with pytest.raises(SlurmError, match="no node to run jobs on"):
        settings_for(record(1), {"node-1": (SIZE, 0)}, private_layout(), leader_compute=False)
    with pytest.raises(SlurmError, match=r"no size known for node-\[2-3\]"):
        settings_for(record(3), {"node-1": (SIZE, 0)}, private_layout())


def test_timers_are_written_as_given():
    timers = Timers(slurmd_timeout=10, min_job_age=2)
    s = settings_for(record(1), {"node-1": (SIZE, 0)}, private_layout(), timers=timers)
    conf = slurm_conf_text(s).splitlines()
    assert "SlurmdTimeout=10" in conf and "MinJobAge=2" in conf and "KillWait=30" in conf
    assert "InactiveLimit=60" in conf  # not Slurm's 0: a recovered allocation whose srun is gone is released


def test_gpu_files_name_nvidia_devices_as_a_numeric_range():
    assert gpu_files(1) == "/dev/nvidia0"
    assert gpu_files(8) == "/dev/nvidia[0-7]"
    with pytest.raises(ValueError):
        gpu_files(0)


# ---- argv ----------------------------------------------------------------------------------------

def test_clients_are_told_where_a_private_config_is():
    assert slurmcmd.with_conf(private_layout(), ["sinfo"]) == [
        "env", "SLURM_CONF=/root/.clustertool/slurm/etc/slurm.conf", "sinfo"]
    assert slurmcmd.with_conf(system_layout(), ["sinfo"]) == ["sinfo"]


def test_sbatch_argv_takes_whole_nodes_leaves_cordoned_ones_out_and_chains():
    spec = slurmcmd.BatchSpec(wrap="srun hostname", nodes=2, exclude=["node-3", "node-4"], job_name="train a",
                              output="/root/out-%j.txt", dependency="afterany:12")
    assert slurmcmd.sbatch_argv(spec) == [
        "sbatch", "--parsable", "--export=ALL", "--nodes=2", "--exclude=node-[3-4]", "--job-name=train a",
        "--output=/root/out-%j.txt", "--dependency=afterany:12", "--exclusive", "--wrap=srun hostname"]
    script = slurmcmd.sbatch_argv(slurmcmd.BatchSpec(script="/root/job.sh", exclusive=False, requeue=True))
    assert script == ["sbatch", "--parsable", "--export=ALL", "--requeue", "/root/job.sh"]
    with pytest.raises(ValueError):
        slurmcmd.sbatch_argv(slurmcmd.BatchSpec(script="a.sh", wrap="true"))


def test_srun_argv_ends_the_step_when_one_task_fails_and_keeps_the_command_whole():
    spec = slurmcmd.StepSpec(command=["python", "train.py", "--lr", "1e-3"], nodes=3, ntasks_per_node=8, label=True)
    assert slurmcmd.srun_argv(spec) == ["srun", "--nodes=3", "--ntasks-per-node=8", "--kill-on-bad-exit=1",
                                        "--label", "--", "python", "train.py", "--lr", "1e-3"]


def test_a_drain_reason_stays_one_argument_through_a_remote_shell():
    reason = "Xid 79 on GPU 2; don't 'touch' $HOME"
    argv = slurmcmd.drain_argv(["node-2", "node-3"], reason)
    assert argv == ["scontrol", "update", "NodeName=node-[2-3]", "State=DRAIN", f"Reason={reason}"]
    assert shlex.split(shlex.join(argv)) == argv
    assert slurmcmd.resume_argv(["node-3"]) == ["scontrol", "update", "NodeName=node-3", "State=RESUME"]
    with pytest.raises(ValueError):
        slurmcmd.drain_argv(["node-1"], " ")


def test_queue_and_node_listings_ask_for_fixed_formats_with_free_text_last():
    assert slurmcmd.sinfo_nodes_argv() == ["sinfo", "--noheader", "--Node", "--format", "%N|%P|%T|%G|%c|%m|%E"]
    assert slurmcmd.squeue_argv(["7", "9"]) == ["squeue", "--noheader", "--format", "%i|%T|%r|%u|%D|%N|%V|%S|%j",
                                                "--jobs", "7,9"]
    assert slurmcmd.sacct_argv(["7"])[-1] == "JobIDRaw,State,ExitCode,User,NNodes,NodeList,Start,End,JobName"
    assert slurmcmd.scancel_argv(["7"], signal="TERM") == ["scancel", "--signal=TERM", "7"]
    assert slurmcmd.slurmd_argv(private_layout(), "node-2") == [
        "slurmd", "-f", "/root/.clustertool/slurm/etc/slurm.conf", "-N", "node-2"]
