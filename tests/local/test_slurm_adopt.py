"""Adopt a Slurm cluster clustertool did not make: `up --provider static --slurm-login HOST`.

The test makes the "site": a plain 3-node local cluster (no scheduler), then Slurm on it with plain commands,
as an administrator would: its own slurm.conf (nodes named gpu-2, gpu-3, not like clustertool's; node-1 is
the login node and controller and runs no jobs), its own munge key and socket, munged, slurmctld and slurmd
started by hand.  A second clustertool home then adopts it through the login node, and a user notices:
the compute nodes come from sinfo; a job goes through sbatch/srun and runs on them; doctor checks Slurm
(munge through the site's own socket) and its network search runs inside an allocation; `copy` reaches the
nodes; as a Slurm operator (root here) `cordon` drains; and `down` leaves the site's Slurm exactly as it was
(its config unchanged, every daemon still running, still answering)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli, unique
from tests.local.conftest import module_cluster, slurm_daemons
from tests.local.test_slurm import _slurm_missing

pytestmark = pytest.mark.local
SITE = "/root/site"  # the site's own Slurm files on every node (a local node's /root is its own)
RUN = "/tmp/site"    # its sockets and pid files
CONF = f"{SITE}/slurm.conf"


def ct(env, *args, timeout=300):
    return run_cli(*args, env=env, timeout=timeout)


def on(env, name, nodes, command) -> dict[str, str]:
    proc = ct(env, "exec", "-c", name, "-n", nodes, "--json", "--", command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["node"]: r["stdout"] for r in json.loads(proc.stdout)["results"]}


def site_conf(addresses: dict[str, str], cpus: int) -> str:
    return "\n".join([
        "ClusterName=site", f"SlurmctldHost=node-1({addresses['node-1']})", "AuthType=auth/munge",
        "CredType=cred/munge", f"AuthInfo=socket={RUN}/munge.socket", "SlurmUser=root",
        f"StateSaveLocation={SITE}/state", f"SlurmdSpoolDir={SITE}/spool", f"SlurmctldPidFile={RUN}/slurmctld.pid",
        f"SlurmdPidFile={RUN}/slurmd.pid", f"SlurmctldLogFile={SITE}/slurmctld.log", f"SlurmdLogFile={SITE}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none",
        f"NodeName=gpu-[2-3] NodeAddr={addresses['node-2']},{addresses['node-3']} CPUs={cpus} State=UNKNOWN",
        "PartitionName=batch Nodes=gpu-[2-3] Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(name, env) of the site: Slurm made by hand on a plain local cluster."""
    reason = _slurm_missing()
    if reason:
        pytest.skip(reason)
    for name, env in module_cluster(tmp_path_factory, 3, "ss"):
        record = json.loads((Path(env["CLUSTERTOOL_HOME"]) / "clusters" / f"{name}.json").read_text())
        addresses = {n["name"]: n["address"] for n in record["nodes"]}
        cpus = int(on(env, name, "node-2", "nproc")["node-2"])
        key = os.urandom(128).hex()
        conf = site_conf(addresses, cpus)
        setup = (f"mkdir -p {SITE}/state {SITE}/spool {RUN} && chmod 755 {RUN} && "
                 f"printf %s '{conf}' > {CONF} && echo CgroupPlugin=cgroup/v1 > {SITE}/cgroup.conf && "
                 f"echo {key} | xxd -r -p > {SITE}/munge.key && chmod 400 {SITE}/munge.key && "
                 f"munged --socket={RUN}/munge.socket --key-file={SITE}/munge.key --pid-file={RUN}/munged.pid "
                 f"--log-file={SITE}/munged.log --seed-file={SITE}/munged.seed")
        on(env, name, "all", setup)
        on(env, name, "node-1", f"slurmctld -f {CONF}")
        on(env, name, "node-2", f"slurmd -f {CONF} -N gpu-2")
        on(env, name, "node-3", f"slurmd -f {CONF} -N gpu-3")
        wait = (f"i=0; while [ $i -lt 600 ]; do env SLURM_CONF={CONF} sinfo --noheader -N -o '%N %T' 2>/dev/null "
                "| grep -c ' idle$' | grep -qx 2 && exit 0; sleep 0.1; i=$((i + 1)); done; exit 1")
        on(env, name, "node-1", wait)  # as its admin would: both compute nodes idle before anyone uses it
        yield name, env


@pytest.fixture(scope="module")
def adopted(site, tmp_path_factory):
    """(site name, site env, adopted name, the adopting home's env): a second home adopts the site."""
    name, env = site
    tmp = tmp_path_factory.mktemp("adopter")
    theirs = dict(env, CLUSTERTOOL_HOME=str(tmp / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp / "hf"))
    login = json.loads((Path(env["CLUSTERTOOL_HOME"]) / "clusters" / f"{name}.json").read_text())["nodes"][0]
    key = Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "id_ecdsa"
    mine = unique("sa")
    up = ct(theirs, "up", "--provider", "static", "--slurm-login", login["address"], "--key", str(key),
            "--user", "root", "--slurm-conf", CONF, "--name", mine)
    assert up.returncode == 0, up.stdout + up.stderr
    yield name, env, mine, theirs
    ct(theirs, "down", "-c", mine, "--yes")


def site_state(env, name) -> tuple[str, list[tuple[int, str]], str]:
    """The site's slurm.conf digest, its daemons (pid, name), and what sinfo says."""
    conf = on(env, name, "node-1", f"cat {CONF}")["node-1"]
    sinfo = on(env, name, "node-1", f"env SLURM_CONF={CONF} sinfo --noheader -N -o '%N %T'")["node-1"]
    return hashlib.sha256(conf.encode()).hexdigest(), sorted(slurm_daemons(name)), sinfo


def test_the_login_nodes_slurm_names_the_nodes_clustertool_adopts(adopted):
    _, _, mine, theirs = adopted
    record = json.loads((Path(theirs["CLUSTERTOOL_HOME"]) / "clusters" / f"{mine}.json").read_text())
    scheduler = record["scheduler"]
    assert (scheduler["made"], scheduler["nodes"], scheduler["names"]) == (
        False, ["node-2", "node-3"], {"node-2": "gpu-2", "node-3": "gpu-3"})
    assert (scheduler["partition"], scheduler["leader_compute"]) == ("batch", False)
    assert scheduler["layout"]["munge_socket"] == f"{RUN}/munge.socket"  # read from the site's own config


def test_a_job_goes_through_the_sites_slurm_to_its_compute_nodes(adopted):
    _, _, mine, theirs = adopted
    proc = ct(theirs, "run", "-c", mine, "--launcher", "process", "--no-tag-output", "--follow", "--",
              "sh", "-c", 'echo "rank $RANK of $WORLD_SIZE on $(hostname) master $MASTER_ADDR"')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ranks = re.findall(r"rank (\d) of 2 on (node-\d) master (\S+)", proc.stdout)
    assert sorted(r[:2] for r in ranks) == [("0", "node-2"), ("1", "node-3")]
    queued = re.search(r"queued in Slurm as job (\d+)", proc.stderr)
    assert queued, proc.stderr


def test_doctor_checks_the_sites_slurm_and_measures_links_inside_an_allocation(adopted):
    _, _, mine, theirs = adopted
    proc = ct(theirs, "doctor", "-c", mine, "--check", "slurm,network", "--json", timeout=600)
    result = json.loads(proc.stdout)
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["slurm"]["status"] == "ok", checks["slurm"]
    assert checks["network"]["data"].get("slurm_hold", "").isdigit(), checks["network"]


def test_copy_reaches_the_adopted_nodes(adopted, tmp_path):
    _, _, mine, theirs = adopted
    src = tmp_path / "data.txt"
    src.write_text("for every node\n")
    copied = ct(theirs, "copy", "-c", mine, "--from", "local", str(src), "/root/copied")
    assert copied.returncode == 0, copied.stdout + copied.stderr
    assert on(theirs, mine, "node-3", "cat /root/copied/data.txt")["node-3"] == "for every node\n"


def test_as_a_slurm_operator_a_cordon_drains_the_sites_node_and_uncordon_resumes_it(adopted):
    name, env, mine, theirs = adopted
    done = ct(theirs, "cordon", "-c", mine, "node-3", "--reason", "fan noise")
    assert "slurm: gpu-3 drained in Slurm" in done.stdout, done.stdout + done.stderr
    assert "gpu-3 drained" in on(env, name, "node-1", f"env SLURM_CONF={CONF} sinfo --noheader -N -o '%N %T'")[
        "node-1"]
    assert "gpu-3 resumed in Slurm" in ct(theirs, "uncordon", "-c", mine, "node-3").stdout


def test_down_leaves_the_sites_slurm_as_it_was(adopted):
    name, env, mine, theirs = adopted
    before = site_state(env, name)
    assert len(before[1]) >= 5  # munged x3, slurmctld, slurmd x2
    assert ct(theirs, "down", "-c", mine, "--yes").returncode == 0
    after = site_state(env, name)
    assert after[0] == before[0] and after[1] == before[1]
    assert re.findall(r"gpu-\d \w+", after[2]) == ["gpu-2 idle", "gpu-3 idle"]
