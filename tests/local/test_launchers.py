"""Every launcher runs the tutorial-shaped DDP script unchanged, and every one fails fast.

Real parts: a 4-node local cluster with 2 slots a node (real sshd nodes in network namespaces),
Open MPI, PyTorch (CPU, gloo), torchrun, PyPI accelerate and DeepSpeed (CPU: no ops built).
Same seed, same final parameters under every launcher; `kill` leaves nothing on any node; when one
rank exits, is SIGKILLed, or a node drops off the network, every process of the job on every
node is gone long before gloo's own timeout, and `jobs` names the rank (or node) and how."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from clustertool.workloads import node_python
from tests.conftest import run_cli
from tests.local.conftest import module_cluster, torch_teardown_abort
from tests.local.test_ddp_env import TRAIN

pytestmark = pytest.mark.local
torch = pytest.importorskip("torch", reason="PyTorch (CPU) is installed by `make venv`; NO_TORCH=1 skips it")

NODES, SLOTS = 4, 2
FAIL_BOUND_S = 60  # gloo's own timeout is 30 min; the <= 5 s target is bench/launch.py's

# Every rank does a few allreduces; one rank then fails (how: argv), the others wait in the next one.
FAIL = '''
import os, signal, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(3):
    dist.all_reduce(t)
if dist.get_rank() == 5:
    print("rank 5 gives up", file=sys.stderr, flush=True)
    if sys.argv[1] == "exit":
        os._exit(3)   # not sys.exit: gloo can abort (SIGABRT) a process that exits with its group alive
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t)
'''

# Rank 7 sleeps outside the collective the others wait in: a hang.
HANG = '''
import time
import torch
import torch.distributed as dist


def stuck_here():
    time.sleep(3600)


dist.init_process_group("gloo")
print("ready", flush=True)
t = torch.ones(1)
if dist.get_rank() == 7:
    stuck_here()
dist.all_reduce(t)
'''

# Waits in allreduces until stopped.
WAIT = '''
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
print("ready", flush=True)
while True:
    dist.all_reduce(t)
    time.sleep(0.2)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, NODES, "ln", "--slots", str(SLOTS))


@pytest.fixture(scope="module")
def folder():
    path = Path("/var/tmp") / f"ct-test-launch-{uuid.uuid4().hex[:8]}"   # every local node sees /var/tmp
    path.mkdir()
    for name, text in (("train.py", TRAIN), ("fail.py", FAIL), ("wait.py", WAIT), ("hang.py", HANG)):
        (path / name).write_text(text)
    yield path
    shutil.rmtree(path)


def python() -> list[str]:
    return node_python()


def bin_of(program: str) -> str:
    """A launcher's script of this environment (its #! line names this environment's python)."""
    return str(Path(sys.executable).parent / program)


def job_processes(name: str, job_id: str) -> list[str]:
    """Every process of the job in any of the cluster's namespaces: 'node pid comm'."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in [line.split()[0] for line in netns.splitlines() if line.startswith(f"ct-{name}-")]:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if f"CLUSTERTOOL_JOB={job_id}".encode() in env:
                found.append(f"{ns} {pid} {comm}")
    return found


def gone_within(name: str, job_id: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    left = job_processes(name, job_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = job_processes(name, job_id)
    return left


def job_record(name: str, env: dict, job_id: str) -> dict:
    proc = run_cli("jobs", "-c", name, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return next(j for j in json.loads(proc.stdout)["jobs"] if j["id"] == job_id)


def launch_words(launcher: str, script: str, *args: str) -> list[str]:
    """The command as a user writes it for each launcher."""
    if launcher == "torchrun":
        return [bin_of("torchrun"), script, *args]
    if launcher == "accelerate":
        return [bin_of("accelerate"), "launch", script, *args]
    if launcher == "deepspeed":
        return [bin_of("deepspeed"), script, *args]
    if launcher == "process":
        return ["--launcher", "process", "--", *python(), script, *args]
    return [*python(), script, *args]


def run_words(name: str, launcher: str, script: str, *args: str) -> list[str]:
    words = launch_words(launcher, script, *args)
    return ["run", "-c", name, *(words if words[0] == "--launcher" else ["--", *words])]


def needs(launcher: str) -> None:
    module = {"accelerate": "accelerate", "deepspeed": "deepspeed"}.get(launcher)
    if module:
        pytest.importorskip(module, reason=f"{launcher} is installed by `make venv` (after torch)")


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "process", "accelerate", "deepspeed"])
def test_the_tutorial_ddp_script_trains_the_same_under_every_launcher(cluster, folder, launcher):
    needs(launcher)
    name, env = cluster
    words = run_words(name, launcher, str(folder / "train.py"))
    proc = run_cli(*words[:3], "--no-tag-output", "--follow", *words[3:], env=env, timeout=300)
    torn = torch_teardown_abort(proc)
    assert proc.returncode == 0 or torn, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = re.findall(r"rank (\d) of (\d) local (\d) node (\d) on (\S+) params (\S+)", proc.stdout)
    by_rank = {int(r[0]): r for r in lines}
    assert sorted(by_rank) == list(range(NODES * SLOTS)), proc.stdout[-3000:]
    assert {r[1] for r in lines} == {str(NODES * SLOTS)}
    # rank r: local r % 2 on node r // 2, in the hostfile's order, as mpirun numbers them
    assert [(r[2], r[3], r[4]) for r in (by_rank[i] for i in range(8))] == [
        (str(i % SLOTS), str(i // SLOTS), f"node-{i // SLOTS + 1}") for i in range(8)]
    # DDP kept the ranks in step, and every launcher trained to the same parameters as mpirun
    assert len({r[5] for r in lines}) == 1
    job_id = re.search(r"job (j[0-9a-f-]+) started", proc.stderr).group(1)
    record = job_record(name, env, job_id)
    assert record["launcher"] == launcher and record["np"] == 8
    assert record["state"] == ("failed" if torn else "succeeded"), record
    logged = run_cli("logs", "-c", name, job_id, env=env)   # every rank's lines in `logs` too
    assert sorted(set(re.findall(r"^rank (\d) of 8", logged.stdout, re.M))) == [str(i) for i in range(8)]
    assert gone_within(name, job_id, 15) == []
    PARAMS[launcher] = {r[5] for r in lines}


PARAMS: dict[str, set] = {}



def test_every_launcher_trained_to_the_same_parameters(cluster):
    if len(PARAMS) < 2:
        pytest.skip("needs the per-launcher runs above")
    assert len(set().union(*PARAMS.values())) == 1, PARAMS


@pytest.mark.parametrize("launcher", ["torchrun", "process", "deepspeed"])
def test_kill_leaves_nothing_on_any_node(cluster, folder, launcher):
    needs(launcher)
    name, env = cluster
    job_id = start_ready(name, env, launcher, str(folder / "wait.py"))
    killed = run_cli("kill", "-c", name, job_id, env=env, timeout=120)
    assert killed.returncode == 0, killed.stderr
    assert gone_within(name, job_id, 5) == []
    assert job_record(name, env, job_id)["state"] == "killed"


def warm_sockets(name: str, env: dict) -> dict[str, list[str]]:
    """node -> the warm launchers' sockets in that local node's home."""
    base = Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "local"
    return {f"node-{i}": sorted(p.name for p in (base / f"node-{i}" / "home" / ".clustertool" / "warm").glob("*.sock"))
            for i in range(1, NODES + 1)}


def launcher_parents(name: str, job_id: str) -> dict[str, tuple[str, bool]]:
    """node -> (the torchrun process's /proc command line, whether its parent is a warm launcher)."""
    found = {}
    for line in job_processes(name, job_id):
        ns, pid, _comm = line.split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if "torchrun" not in cmdline.split(" ", 2)[1]:   # the launcher: python .../torchrun ...
            continue
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        penv = Path(f"/proc/{parent}/environ").read_bytes().split(b"\0")
        found[f"node-{ns.rsplit('-', 1)[1]}"] = (cmdline, any(e.startswith(b"CLUSTERTOOL_WARM_KEY=") for e in penv))
    return found


def test_a_later_torchrun_start_is_forked_from_each_nodes_warm_launcher(cluster, folder):
    """After a node's first torchrun start, the agent keeps a warm torchrun there (nodeprogs/warmlaunch.py); the
    next job's torchrun is its fork and is, to every tool that looks, that job's torchrun: `kill` finds it by the
    job's marker in its environment and leaves nothing.  (CLUSTERTOOL_WARM=0, no warm launcher: the unit tests.)"""
    name, env = cluster
    first = start_ready(name, env, "torchrun", str(folder / "wait.py"))  # its agents make the warm launchers
    assert run_cli("kill", "-c", name, first, env=env, timeout=120).returncode == 0
    deadline = time.monotonic() + 600   # each imports torch at SCHED_IDLE: only while the box has CPU to spare
    while not all(warm_sockets(name, env).values()):
        assert time.monotonic() < deadline, f"no warm launcher on some node: {warm_sockets(name, env)}"
        time.sleep(0.5)
    made = warm_sockets(name, env)
    job_id = start_ready(name, env, "torchrun", str(folder / "wait.py"))
    parents = launcher_parents(name, job_id)
    assert sorted(parents) == [f"node-{i}" for i in range(1, NODES + 1)], parents
    assert all(warm and "--nnodes 4" in cmdline for cmdline, warm in parents.values()), parents
    killed = run_cli("kill", "-c", name, job_id, env=env, timeout=120)
    assert killed.returncode == 0, killed.stderr
    assert gone_within(name, job_id, 5) == []
    assert job_record(name, env, job_id)["state"] == "killed"
    assert warm_sockets(name, env) == made   # the warm launchers stay for the next job


@pytest.mark.parametrize("launcher,how", [("mpirun", "exit"), ("torchrun", "exit"), ("process", "exit"),
                                          ("process", "kill"), ("torchrun", "kill"), ("deepspeed", "kill")])
def test_one_rank_failing_stops_the_job_everywhere_and_jobs_names_it(cluster, folder, launcher, how):
    name, env = cluster
    words = run_words(name, launcher, str(folder / "fail.py"), how)
    t0 = time.monotonic()
    proc = run_cli(*words[:3], "--follow", *words[3:], env=env, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < FAIL_BOUND_S + 30, (took, proc.stderr[-2000:])
    job_id = re.search(r"job (j[0-9a-f-]+) started", proc.stderr).group(1)
    assert gone_within(name, job_id, FAIL_BOUND_S) == []
    failure = job_record(name, env, job_id)["failure"]
    assert (failure["rank"], failure["node"]) == (5, "node-3"), failure
    if how == "exit":
        assert failure["code"] == 3
    else:
        assert failure["signal"] == 9
    said = f"rank 5 on node-3 {'exited 3' if how == 'exit' else 'killed by signal 9'}"
    assert f"job {job_id} failed: {said}" in proc.stderr     # run --follow says it at the end
    if launcher != "mpirun" or how == "exit":
        assert "rank 5 gives up" in " ".join(failure["tail"])   # the rank's last stderr lines


def start_ready(name: str, env: dict, launcher: str, script: str, *flags: str) -> str:
    """Start ``script`` (it prints "ready" once in its loop) detached; its job id once every rank said it."""
    words = run_words(name, launcher, script)
    started = run_cli(*words[:3], *flags, *words[3:], env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    deadline = time.monotonic() + 120
    out = ""
    while len(set(re.findall(r"\[\d+,(\d)\]<stdout>:ready", out))) < 8:
        assert time.monotonic() < deadline, f"not every rank started: {out[-2000:]}"
        time.sleep(0.5)
        out = run_cli("logs", "-c", name, job_id, env=env).stdout
    return job_id


def test_a_hang_is_found_and_stacks_show_the_odd_rank_alone(cluster, folder):
    name, env = cluster
    job_id = start_ready(name, env, "torchrun", str(folder / "hang.py"), "--hang-timeout", "20s")
    try:
        stacks = run_cli("stacks", "-c", name, job_id, env=env, timeout=120)
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        # the Python stacks' groups; the Flight Recorder's own lines follow them (test_flight_recorder_local.py)
        groups = [line for line in stacks.stdout.strip().splitlines() if not line.startswith("Flight Recorder")]
        assert len(groups) == 2, stacks.stdout
        assert groups[0].startswith("ranks 0-6 (node-[1-4]): ") and "all_reduce" in groups[0]
        assert groups[1].startswith("rank 7 (node-4): stuck_here (hang.py:")
        deadline = time.monotonic() + 120   # 20 s without output or CPU, then the supervisor records it
        while True:
            shown = run_cli("jobs", "-c", name, env=env, timeout=60).stdout
            if re.search(rf"{job_id}\s+hung\? \(no output, no CPU for \d+s\)", shown):
                break
            if time.monotonic() > deadline:   # what the hang check saw last, and the job's log
                saw = run_cli("exec", "-c", name, "-n", "leader", "--no-live", "--",
                              f"cat ~/.clustertool/jobs/{job_id}/hangwatch", env=env, timeout=60).stdout
                raise AssertionError(shown + saw + run_cli("logs", "-c", name, job_id, env=env, timeout=60).stdout)
            time.sleep(2)
        assert re.search(r"rank 7 \(node-4\): stuck_here \(hang\.py:\d+\)", shown), shown   # where, as saved
        record = job_record(name, env, job_id)
        assert record["state"] == "running" and record["hung"]["timeout"] == 20
    finally:
        assert run_cli("kill", "-c", name, job_id, env=env, timeout=120).returncode == 0
    assert gone_within(name, job_id, 10) == []


def test_bench_scaling_runs_each_size_under_the_launcher(cluster, folder):
    """`bench scaling --launcher torchrun`: each size a torchrun job on the first N nodes."""
    name, env = cluster
    (folder / "rate.py").write_text("import os\nprint(f\"samples/sec: {100 * int(os.environ['WORLD_SIZE'])}\", "
                                    "flush=True)\n")
    proc = run_cli("bench", "scaling", "-c", name, "--nodes", "1,2", "--launcher", "torchrun", "--json", "--",
                   bin_of("torchrun"), str(folder / "rate.py"), env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    points = json.loads(proc.stdout)["points"]
    assert [(p["nodes"], p["ranks"]) for p in points] == [(1, 2), (2, 4)]
    jobs = json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"]
    assert [j["launcher"] for j in jobs if (j["name"] or "").startswith("scaling-")][-2:] == ["torchrun"] * 2


def _veth(name: str, index: int) -> str:
    """The host side of node ``index``'s link to the cluster bridge."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if f"link-netns ct-{name}-{index}" in line:
            return line.split(": ")[1].split("@")[0]
    raise AssertionError(f"no link of node {index}: {out}")


def test_a_node_that_drops_off_the_network_stops_the_job_everywhere(cluster, folder):
    name, env = cluster
    job_id = start_ready(name, env, "torchrun", str(folder / "wait.py"))
    veth = _veth(name, 3)
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)   # silent: no reset, no answer
    t0 = time.monotonic()
    try:
        deadline = t0 + FAIL_BOUND_S
        while [p for p in job_processes(name, job_id) if not p.startswith(f"ct-{name}-3 ")]:
            assert time.monotonic() < deadline, job_processes(name, job_id)
            time.sleep(0.25)
        print(f"others gone {time.monotonic() - t0:.1f}s after the cut")
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert gone_within(name, job_id, FAIL_BOUND_S) == []   # node-3's own, once it hears mpirun is gone
    print(f"node-3's gone {time.monotonic() - t0:.1f}s after the cut")
    record = job_record(name, env, job_id)
    assert record["state"] == "failed" and record["failure"]["node"] == "node-3", record
    assert record["failure"]["kind"] == "lost"
    shown = run_cli("jobs", "-c", name, env=env).stdout
    assert re.search(rf"{job_id}\s+failed \(node-3 stopped answering\)", shown), shown


def test_a_node_whose_sshd_stops_mid_job_stops_the_job_everywhere(cluster, folder):
    """Last in this module: in the local provider a node whose sshd dies is gone (its PID 1 exits)."""
    name, env = cluster
    job_id = start_ready(name, env, "process", str(folder / "wait.py"))
    pids = subprocess.run(["ip", "netns", "pids", f"ct-{name}-4"], capture_output=True, text=True).stdout.split()
    listener = [p for p in pids if b"[listener]" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert listener, "node-4's sshd"
    subprocess.run(["kill", *listener], check=True)
    assert gone_within(name, job_id, FAIL_BOUND_S) == []
    record = job_record(name, env, job_id)
    assert record["state"] == "failed" and record["failure"]["node"] == "node-4", record
