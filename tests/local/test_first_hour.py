"""The first hour of a new user on a local cluster (issue 33), against real sshd nodes: what each
mistake and each headline example looks like, and that nothing outlives its purpose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster, provider_state

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 3, "fh")


def _on_nodes(name, env, line) -> dict[str, str]:
    """{node: its stdout} of ``line`` run on every node."""
    proc = run_cli("exec", "-c", name, "--json", "--", line, env=env)
    return {r["node"]: r["stdout"] for r in json.loads(proc.stdout)["results"]}


def _running(line: str) -> list[int]:
    """Pids of the shells running ``line`` (``$SHELL -c line``) on any node: the nodes' PID namespaces are
    children of this machine's, so their processes show here, and this look needs no ssh round trip."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")[:-1]
        except (OSError, ValueError):
            continue
        if argv[1:] == [b"-c", line.encode()]:
            pids.append(int(entry))
    return pids


def test_exec_timeout_returns_at_the_timeout_and_stops_the_command_on_the_nodes(three):
    """The command ignores TERM and never ends by itself: exec returns at its 2 s timeout while the command
    still runs on every node (it took 12-17 s once), then the node's own timeout KILLs it (TERM at 2 s, KILL
    2 s later).  Events, not seconds: the commands are seen running right after exec returned, and seen gone
    later.  The order rests on a margin the tool sets itself (KILL_AFTER_S: the node's KILL comes 2 s after
    exec's own deadline), not on the test's guess of a loaded box's speed."""
    name, env = three
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    line = f"echo $$ > ~/fh-held-{name}; trap '' TERM; while :; do sleep 0.05; done"
    proc = run_cli("exec", "-c", name, "--timeout", "2", "--", line, env=env)
    running_when_returned = _running(line)
    assert proc.returncode == 255, proc.stderr
    assert "node-[1-3] (timed out)" in proc.stdout + proc.stderr
    started = sorted(p.parent.parent.name for p in nodes_dir.glob(f"node-*/home/fh-held-{name}"))
    assert started == ["node-1", "node-2", "node-3"], started
    assert len(running_when_returned) == 3, f"exec returned after the command ended: {running_when_returned}"
    safety = time.monotonic() + 120  # only a failure waits this long: the command never ends by itself
    while _running(line):
        assert time.monotonic() < safety, f"the command still runs on the nodes after exec returned: {_running(line)}"
        time.sleep(0.2)
    left = _on_nodes(name, env, f"pgrep -af 'fh-held-{name[:-1]}[{name[-1]}]' || true")
    assert not any(left.values()), f"the command still runs on the nodes after exec returned: {left}"


DDP = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum={t[0].item():g}")
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("proj")
    (folder / "train.py").write_text(DDP)
    return folder


@pytest.mark.parametrize("launcher", [["python"], ["torchrun"]], ids=["python", "torchrun"])
def test_the_headline_examples_run_with_the_users_virtualenv(three, project, launcher):
    pytest.importorskip("torch", reason="needs PyTorch in this virtualenv (make setup installs it)")
    name, env = three
    proc = run_cli("run", "-c", name, "--sync", str(project), "--follow", "--", *launcher, "train.py", env=env)
    assert proc.returncode == 0, proc.stderr
    sums = sorted(line.split(">:", 1)[-1] for line in proc.stdout.splitlines() if " sum=" in line)
    assert sums == [f"rank {r}/3 sum=6" for r in range(3)], proc.stdout
    job = json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"][-1]
    assert job["command"] == [*launcher, "train.py"]  # `jobs` showed a torchrun job as `train.py`


def test_a_program_the_nodes_lack_is_named_before_anything_starts(three):
    name, env = three
    before = json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"]
    proc = run_cli("run", "-c", name, "--", "trian.py", env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-2:] == [
        "error: trian.py: not found on node-[1-3] (the ranks' PATH there)",
        "hint: give its full path, or -x PATH=DIR:/usr/bin:/bin for its folder DIR (`clustertool run --dry-run` says "
        "which python the ranks get)"]
    assert json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"] == before


def test_a_dry_run_says_which_python_the_ranks_get(three):
    name, env = three
    proc = run_cli("run", "-c", name, "--dry-run", "--", "python", "train.py", env=env)
    venv = os.path.dirname(os.path.dirname(sys.executable))
    assert f"» the ranks' python: {venv}/bin/python (the virtualenv {venv};" in proc.stderr


def _in(folder, *args, env):
    """The CLI run from ``folder``, as a user in their project folder runs it."""
    return subprocess.run([sys.executable, "-m", "clustertool", *args], env=env, cwd=folder, capture_output=True,
                          text=True, timeout=300)


def test_copy_of_a_file_here_but_not_on_the_leader_hints_from_local(three, tmp_path):
    name, env = three
    (tmp_path / "data50.bin").write_bytes(b"x" * 1000)
    proc = _in(tmp_path, "copy", "-c", name, "data50.bin", "/scratch/data", env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-2:] == [
        "error: SRC 'data50.bin' is not on the leader (node-1), but it is here",
        f"hint: clustertool copy -c {name} --from local data50.bin /scratch/data"]
    proc = _in(tmp_path, "copy", "-c", name, "nowhere.bin", "/scratch/data", env=env)
    assert proc.stderr.splitlines()[-2:] == [
        "error: SRC 'nowhere.bin' is neither on the leader (node-1) nor here",
        "hint: a path on the leader (relative: to its home), or --from local with a path here"]


def test_copy_to_a_destination_that_cannot_be_made_is_one_line_and_nothing_is_sent(three, project):
    name, env = three
    proc = _in(project.parent, "copy", "-c", name, "--from", "local", f"{project.name}/train.py", "/proc/nope", env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("» ")]
    assert errors == ["error: cannot write DEST '/proc/nope' on node-[1-3]: /proc: No such file or directory",
                      "hint: give a folder the nodes can write, e.g. /scratch/data (`clustertool exec -c "
                      f"{name} -- ls -ld DIR` shows one)"], proc.stderr
    assert all("files sent" not in line for line in proc.stderr.splitlines())


@pytest.mark.parametrize("nodes", ["node-[1-2]", None], ids=["2-nodes", "3-nodes"])
def test_a_rank_that_cannot_start_is_named_the_same_way_on_2_and_3_nodes(three, nodes):
    name, env = three
    where = ["--nodes", nodes] if nodes else []
    proc = run_cli("run", "-c", name, *where, "--follow", "--", "./no-such.sh", "--lr", "0.1", env=env)
    assert proc.returncode == 127, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"job j\S+ failed: rank \d on node-\d exited 127: ct-rank: \./no-such\.sh: not found", last), \
        proc.stderr
    job = json.loads(run_cli("jobs", "-c", name, "--json", env=env).stdout)["jobs"][-1]
    assert job["command"] == ["./no-such.sh", "--lr", "0.1"] and job["failure"]["code"] == 127
    row = [line for line in run_cli("jobs", "-c", name, env=env).stdout.splitlines() if job["id"] in line][0]
    assert "failed (rank " in row and "not found)" in row and row.endswith("./no-such.sh --lr 0.1")
