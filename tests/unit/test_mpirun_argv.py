"""mpirun command building: every option, placement errors, quoting through a real shell."""

from __future__ import annotations

import json
import subprocess

import pytest

from clustertool.core.errors import UsageError
from clustertool.jobs import scripts
from clustertool.jobs.mpirun import (
    RANK_WRAPPER,
    MpiOptions,
    build_argv,
    cluster_subnet,
    job_hostfile,
    placement,
    split_command,
)

pytestmark = pytest.mark.unit

HOSTS = [("10.0.0.1", 8), ("10.0.0.2", 8)]


def argv(**kw):
    kw.setdefault("command", ["python", "train.py"])
    kw.setdefault("unbuffered", False)
    kw.setdefault("tag_output", False)
    return build_argv(kw.pop("hosts", HOSTS), MpiOptions(**kw))


def pairs(av, flag):
    return [av[i + 1] for i, a in enumerate(av) if a == flag]


def test_defaults_are_the_seeds_flags_with_all_slots_and_H():
    av = argv()
    assert av[:5] == ["mpirun", "-np", "16", "-H", "10.0.0.1:8,10.0.0.2:8"]
    assert av[5:13] == ["-bind-to", "none", "-map-by", "slot", "--mca", "pml", "ob1", "--mca"]
    assert av[-2:] == ["python", "train.py"]
    assert "--allow-run-as-root" not in av and "--oversubscribe" not in av and "-x" not in av


def test_root_adds_allow_run_as_root():
    assert argv(as_root=True)[1] == "--allow-run-as-root"


def test_subnet_restricts_btl_and_oob_to_the_cluster_network():
    av = argv(subnet="10.213.4.0/24")
    assert pairs(av, "--mca")[2:] == ["btl_tcp_if_include", "oob_tcp_if_include"]
    assert av[av.index("btl_tcp_if_include") + 1] == "10.213.4.0/24"
    assert av[av.index("oob_tcp_if_include") + 1] == "10.213.4.0/24"


def test_without_subnet_loopback_and_docker_are_excluded():
    av = argv()
    assert av[av.index("btl_tcp_if_exclude") + 1] == "lo,docker0"
    assert av[av.index("oob_tcp_if_exclude") + 1] == "lo,docker0"


def test_np_and_per_node_caps():
    assert argv(np=4)[2] == "4"
    av = argv(per_node=2)
    assert av[2] == "4" and av[4] == "10.0.0.1:2,10.0.0.2:2"
    assert argv(per_node=2, np=3)[2] == "3"


def test_np_larger_than_slots_is_a_clear_error_unless_oversubscribe():
    with pytest.raises(UsageError, match=r"--np 17 is more than the 16 slot\(s\) of the 2 selected node"):
        argv(np=17)
    av = argv(np=17, oversubscribe=True)
    assert av[2] == "17" and "--oversubscribe" in av


def test_per_node_above_a_nodes_slots_is_an_error_unless_oversubscribe():
    with pytest.raises(UsageError, match="--per-node 9 is more than the 8 slot"):
        argv(per_node=9)
    assert argv(per_node=9, oversubscribe=True)[4] == "10.0.0.1:9,10.0.0.2:9"


@pytest.mark.parametrize("kw", [{"np": 0}, {"per_node": 0}, {"command": []}, {"hosts": []}])
def test_bad_counts_and_empty_inputs_are_usage_errors(kw):
    with pytest.raises(UsageError):
        argv(**kw)


def test_hostfile_replaces_H():
    av = argv(hostfile="/root/.clustertool/jobs/j1/hostfile")
    assert "-H" not in av and pairs(av, "--hostfile") == ["/root/.clustertool/jobs/j1/hostfile"]
    assert job_hostfile(HOSTS) == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n"


def test_each_exported_variable_gets_its_own_x():
    av = argv(env=["NCCL_SOCKET_IFNAME=eth0", "PATH", "MSG=hello world", "Q=it's \"quoted\""])
    assert pairs(av, "-x") == ["NCCL_SOCKET_IFNAME=eth0", "PATH", "MSG=hello world", "Q=it's \"quoted\""]


@pytest.mark.parametrize("bad", ["1BAD=x", "A-B=1", "=x", "A B=1"])
def test_invalid_variable_names_are_refused(bad):
    with pytest.raises(UsageError, match="not a valid environment variable name"):
        argv(env=[bad])


def test_horovod_knobs_become_variables():
    av = argv(horovod_fusion_mb=64, horovod_cycle_ms=3.5, horovod_timeline="/tmp/t l.json", horovod_autotune=True)
    assert pairs(av, "-x") == ["HOROVOD_FUSION_THRESHOLD=67108864", "HOROVOD_CYCLE_TIME=3.5",
                               "HOROVOD_TIMELINE=/tmp/t l.json", "HOROVOD_AUTOTUNE=1"]
    assert pairs(argv(horovod_cycle_ms=5), "-x") == ["HOROVOD_CYCLE_TIME=5"]
    with pytest.raises(UsageError):
        argv(horovod_cycle_ms=0)


def test_nccl_debug_plugin_env_and_unbuffered():
    av = argv(nccl_debug="INFO", plugin_env={"NCCL_NET_PLUGIN": "clustertool"}, unbuffered=True)
    assert pairs(av, "-x") == ["PYTHONUNBUFFERED=1", "NCCL_DEBUG=INFO", "NCCL_NET_PLUGIN=clustertool"]


def test_workdir_tag_output_and_extra_mpi_args():
    av = argv(workdir="/data/my run", tag_output=True, mpi_args=["--mca", "btl_tcp_links", "4"])
    assert pairs(av, "-wdir") == ["/data/my run"] and "--tag-output" in av
    assert av[-5:-2] == ["--mca", "btl_tcp_links", "4"]


def test_per_rank_output_files_replace_mpiruns_forwarding_and_tagging():
    av = argv(output_dir="/home/u/.clustertool/jobs/j1/out", tag_output=True)
    assert pairs(av, "--output-filename") == ["/home/u/.clustertool/jobs/j1/out:nocopy"]
    assert "--tag-output" not in av  # Open MPI would tag every fragment inside the files


def test_job_id_exports_the_marker_and_wraps_every_rank():
    av = argv(job_id="j1122-abc123", env=["A=1"])
    assert pairs(av, "-x") == ["CLUSTERTOOL_JOB=j1122-abc123", "A=1"]
    assert av[-6:] == ["sh", "-c", RANK_WRAPPER, "ct-rank", "python", "train.py"]


def test_the_launch_script_passes_values_with_spaces_and_quotes_through_a_real_shell():
    command = ["printf", "%s\\n", "two words", "it's", 'say "hi"', "$HOME", "`x`", "a;b"]
    av = build_argv(HOSTS, MpiOptions(command=command, env=["MSG=hello 'world' \"x\" $y"]))
    av[0] = "echo_argv"
    script = scripts.launch_script("j1-abc", av, None)
    line = next(ln for ln in script.splitlines() if "; echo $?" in ln)
    joined = line[line.index("{ ") + 2:line.index("; echo $?")]
    out = subprocess.run(["sh", "-c", 'echo_argv() { for a in "$@"; do printf "%s\\0" "$a"; done; }; ' + joined],
                         capture_output=True, text=True, check=True).stdout
    assert out.split("\0")[:-1] == av[1:]


def test_the_rank_wrapper_records_ids_and_execs_the_program(tmp_path):
    env = {"HOME": str(tmp_path), "CLUSTERTOOL_JOB": "j1-abc", "OMPI_COMM_WORLD_RANK": "3", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", RANK_WRAPPER, "ct-rank", "sh", "-c", 'echo "pid $$"'], env=env,
                         capture_output=True, text=True, check=True).stdout
    files = list((tmp_path / ".clustertool/jobs/j1-abc/ranks").iterdir())
    assert len(files) == 1 and files[0].name.endswith(".3")
    pid, ppid, pgid, sid = files[0].read_text().split()
    assert out == f"pid {pid}\n"  # exec: the program has the pid that was recorded


def test_a_rank_whose_program_is_not_found_records_itself_as_the_nodes_failure(tmp_path):
    # mpirun's own log does not always name a rank that could not exec (exit 127): the job's `failure`
    # record on the node does, as the job agent's does for the other launchers (jobs/failure.py reads both)
    env = {"HOME": str(tmp_path), "CLUSTERTOOL_JOB": "j1-abc", "OMPI_COMM_WORLD_RANK": "2", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["sh", "-c", RANK_WRAPPER, "ct-rank", "./no-such.sh", "x"], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 127 and proc.stderr == "ct-rank: ./no-such.sh: not found\n"
    record = json.loads((tmp_path / ".clustertool/jobs/j1-abc/failure").read_text())
    assert record["rank"] == 2 and record["code"] == 127 and record["time"] > 0


def test_placement_returns_capped_hosts():
    assert placement(HOSTS, MpiOptions(command=["x"], per_node=1)) == ([("10.0.0.1", 1), ("10.0.0.2", 1)], 2)


@pytest.mark.parametrize("addresses,declared,expected", [
    (["10.213.4.1", "10.213.4.3"], None, "10.213.4.0/24"),
    (["10.1.4.1", "10.1.9.3"], None, "10.1.0.0/16"),
    (["10.1.4.1", "172.16.0.1"], None, None),
    (["10.1.4.1", "10.1.9.3"], "10.1.0.0/20", "10.1.0.0/20"),
    (["10.1.4.1", "10.1.99.3"], "10.1.0.0/20", "10.1.0.0/16"),
    (["node-a", "node-b"], None, None),
])
def test_cluster_subnet(addresses, declared, expected):
    assert cluster_subnet(addresses, declared) == expected


def test_one_argument_with_spaces_is_split_like_a_shell_several_are_kept():
    assert split_command(["python train.py --msg 'a b'"]) == ["python", "train.py", "--msg", "a b"]
    assert split_command(["python", "a b.py"]) == ["python", "a b.py"]
    assert split_command(["hostname"]) == ["hostname"]
    with pytest.raises(UsageError, match="cannot split"):
        split_command(["python 'unclosed"])
