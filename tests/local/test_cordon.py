"""Cordon on a real 4-node local cluster: a cordoned node is out of both hostfiles (this machine's and
the leader's ~/hostfile) and of every job (mpirun, and a node launcher), `status --json` shows it,
`exec` still reaches it, and after `uncordon` it is back; `doctor --cordon` cordons a node whose
sshd is gone (without reaching it)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster, stop_node_sshd

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "cd")


def cli(cluster, command, *args, timeout=120):
    name, env = cluster
    return run_cli(command, "-c", name, *args, env=env, timeout=timeout)


def hostfiles(cluster) -> tuple[str, str]:
    """(this machine's hostfile, the leader's ~/hostfile)."""
    name, env = cluster
    local = open(os.path.join(env["CLUSTERTOOL_HOSTFILE_DIR"], name)).read()
    proc = cli(cluster, "exec", "--nodes", "leader", "--no-live", "--", "cat ~/hostfile")
    assert proc.returncode == 0, proc.stderr
    return local, proc.stdout


def ran_on(cluster, *command) -> set[str]:
    """The host names a job's ranks printed (one rank per node; mpirun may add its own warning lines,
    e.g. a setpgid race in plm:rsh: only host names count)."""
    proc = cli(cluster, "run", "--per-node", "1", "--follow", "--", *(command or ["hostname"]))
    assert proc.returncode == 0, proc.stderr
    words = {line.split(":")[-1].strip() for line in proc.stdout.splitlines()}
    return {w for w in words if re.fullmatch(r"node-\d+", w)}


def statuses(cluster) -> dict:
    proc = cli(cluster, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}


def test_a_cordoned_node_leaves_the_hostfiles_and_jobs_and_comes_back_after_uncordon(cluster):
    name, env = cluster
    with open(os.path.join(env["CLUSTERTOOL_HOME"], "clusters", f"{name}.json")) as fh:
        address = {n["name"]: n["address"] for n in json.load(fh)["nodes"]}
    proc = cli(cluster, "cordon", "node-3", "--reason", "Xid 79 on GPU 2")
    assert proc.returncode == 0 and proc.stdout.startswith("cordoned node-3 (Xid 79 on GPU 2)"), proc
    for text in hostfiles(cluster):
        assert f"{address['node-3']} " not in text and text.count("slots=1") == 3, text
    shown = statuses(cluster)
    assert shown["node-3"]["cordon"]["reason"] == "Xid 79 on GPU 2" and shown["node-2"]["cordon"] is None
    assert ran_on(cluster) == {"node-1", "node-2", "node-4"}
    torchrun = str(Path(sys.executable).parent / "torchrun")  # this environment's, as the launcher tests use it
    assert ran_on(cluster, torchrun, "--no-python", "hostname") == {"node-1", "node-2", "node-4"}
    refused = cli(cluster, "run", "--nodes", "node-[2-3]", "--", "hostname")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: node-3 is cordoned (Xid 79 on GPU 2): jobs do not run there\n"), refused.stderr
    reached = cli(cluster, "exec", "--nodes", "node-3", "--no-live", "--", "hostname")
    assert reached.returncode == 0 and reached.stdout.splitlines()[-1] == "node-3", reached
    proc = cli(cluster, "uncordon", "node-3")
    assert proc.returncode == 0, proc.stderr
    for text in hostfiles(cluster):
        assert f"{address['node-3']} slots=1" in text and text.count("slots=1") == 4, text
    assert statuses(cluster)["node-3"]["cordon"] is None
    assert ran_on(cluster) == {"node-1", "node-2", "node-3", "node-4"}


def test_doctor_cordon_cordons_the_node_whose_sshd_is_gone(cluster):
    name, env = cluster
    stop_node_sshd(name, 4)
    try:
        proc = cli(cluster, "doctor", "--check", "reach,ssh-mesh", "--cordon", "--json", timeout=180)
        assert proc.returncode == 1, proc.stderr
        done = json.loads(proc.stdout)["cordon"]
        assert list(done["cordoned"]) == ["node-4"] and done["cordoned"]["node-4"].startswith(
            "doctor reach: not reachable over SSH"), done
        assert done["leader_hostfile"] == "written" and done["skipped"] == []
        assert statuses(cluster)["node-4"]["cordon"]["by"] == "doctor"
        assert ran_on(cluster) == {"node-1", "node-2", "node-3"}
        text = cli(cluster, "doctor", "--check", "reach")
        assert "INFO    cordon node-4: cordoned" in text.stdout, text.stdout
    finally:
        back = cli(cluster, "reboot", "--nodes", "node-4", "--yes")
        assert back.returncode == 0, back.stderr
        assert cli(cluster, "uncordon", "node-4").returncode == 0
    assert "node-4" in ran_on(cluster)
