"""Fixtures for the local tier: real sshd nodes in real network namespaces (root only)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, unique

pytestmark = pytest.mark.local


def _prerequisites_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"needs {tool}"
    if not os.path.exists("/usr/sbin/sshd"):
        return "needs openssh-server (/usr/sbin/sshd)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _prerequisites_missing()
    for item in items:
        if "tests/local/" in str(item.fspath):
            item.add_marker(pytest.mark.local)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"local provider tier: {reason}"))


def controllers(name: str) -> list[int]:
    """Live processes running this cluster's controller (zombies are gone for this purpose)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            continue
        if alive and b"clustertool.controller.daemon" in words and name.encode() in words:
            found.append(int(pid))
    return found


def local_leftovers(name: str) -> list[str]:
    """Everything of cluster `name` the local provider could have left on this machine."""
    left = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"ct-{name}-")]
    procs = subprocess.run(["pgrep", "-af", f"clusters/{name}/"], capture_output=True, text=True).stdout
    left += [f"process {line}" for line in procs.splitlines()]
    sshfs = subprocess.run(["pgrep", "-af", f"clustertool-shared/{name}/"], capture_output=True, text=True).stdout
    left += [f"sshfs process {line}" for line in sshfs.splitlines()]
    left += [f"fuse.sshfs mount {m}" for m in sshfs_mounts(name)]
    left += [f"monitoring process {p}" for p in monitoring_processes(name)]
    left += [f"{comm} process {pid}" for pid, comm in slurm_daemons(name)]
    return left


def monitoring_processes(name: str) -> list[str]:
    """Processes `monitoring enable` started for cluster `name` (node exporter, Prometheus, clustertool's
    exporter, the GPU textfile writer): each carries CLUSTERTOOL_MONITORING=<name>, in any namespace."""
    mark, found = f"CLUSTERTOOL_MONITORING={name}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                found.append(f"{pid} {open(f'/proc/{pid}/comm').read().strip()}")
        except OSError:
            continue
    return found


SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")


def slurm_daemons(name: str) -> list[tuple[int, str]]:
    """Slurm's and munge's daemons of cluster `name`: those whose mount namespace holds the cluster's node
    folders (a local node's /root is bound from CLUSTERTOOL_HOME/clusters/<name>/local/<node>/home)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            if comm in SLURM_DAEMONS and f"/clusters/{name}/" in open(f"/proc/{pid}/mountinfo").read():
                found.append((int(pid), comm))
        except OSError:
            continue
    return found


def sshfs_mounts(name: str) -> list[str]:
    """fuse.sshfs mounts of cluster `name`'s shared filesystem, in any mount namespace on this machine."""
    found, seen = set(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in seen:
                continue
            seen.add(ns)
            lines = open(f"/proc/{pid}/mountinfo").read().splitlines()
        except OSError:
            continue
        found |= {line for line in lines if " - fuse.sshfs " in line and f"clustertool-shared/{name}/" in line}
    return sorted(found)


@pytest.fixture
def local_cluster(ct_env):
    """Factory: make(nodes=3, *flags) brings a local cluster up via the CLI; down at teardown."""
    made: list[str] = []

    def make(nodes: int = 3, *flags: str, name: str | None = None, env: dict | None = None) -> str:
        name = name or unique("lc")
        proc = run_cli("up", "--provider", "local", "--nodes", str(nodes), "--name", name, *flags, env=env or ct_env)
        assert proc.returncode == 0, f"up failed: {proc.stderr}"
        made.append(name)
        return name

    yield make
    for name in made:
        run_cli("down", "-c", name, "--yes", env=ct_env)
        assert local_leftovers(name) == [], f"cluster {name} left things behind"


def module_cluster(tmp_path_factory, nodes: int, prefix: str, *flags: str):
    """Generator for a module-scoped fixture: one cluster shared by a module's tests (``flags``: more
    `up` flags, e.g. "--slots", "2").

    Yields (name, env); downs the cluster after the module and checks nothing is left.
    """
    tmp = tmp_path_factory.mktemp(prefix)
    env = dict(os.environ, CLUSTERTOOL_HOME=str(tmp / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp / "hf"),
               CLUSTERTOOL_NO_SSH_INCLUDE="1")
    name = unique(prefix)
    up = run_cli("up", "--provider", "local", "--nodes", str(nodes), "--name", name, *flags, env=env)
    assert up.returncode == 0, up.stderr
    yield name, env
    run_cli("down", "-c", name, "--yes", env=env)
    assert local_leftovers(name) == [], f"cluster {name} left things behind"


# sync-s3 and the dataset-from-s3 playbook: a moto S3 server on the cluster bridge.  The credentials
# are this run's own (moto takes any), so a test can look for them on the nodes and be sure.
CREDS = {"AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
         "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30), "AWS_DEFAULT_REGION": "us-east-1"}
KEYS = [f"ds/part {i:02d} ü.bin" for i in range(9)] + ["ds/sub/deep 'q'.txt", "ds/sub/more/x.bin"]


def provider_state(ct_env, name) -> dict:
    path = os.path.join(ct_env["CLUSTERTOOL_HOME"], "clusters", f"{name}.json")
    return json.load(open(path))["provider_state"]


def _bridge_address(ct_env, name):
    bridge = provider_state(ct_env, name)["bridge"]
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True).stdout
    return out.split()[3].split("/")[0]


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_cluster(ct_env, local_cluster):
    """A 4-node cluster and a moto S3 server the nodes reach on the bridge; both gone after.

    Yields (name, endpoint, env with this run's AWS keys, boto3 client)."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    import boto3

    name = local_cluster(4, env=dict(ct_env, **CREDS))  # as a user with AWS keys in the environment would
    host = _bridge_address(ct_env, name)
    port = _free_port(host)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.2)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        client.create_bucket(Bucket="train-data")
        for i, key in enumerate(KEYS):
            client.put_object(Bucket="train-data", Key=key, Body=bytes([i]) * (5000 + 1000 * i))
        env = dict(ct_env, **CREDS)
        env.pop("AWS_ENDPOINT_URL", None)
        yield name, endpoint, env, client
    finally:
        server.terminate()
        server.wait(timeout=10)


# PyTorch's own teardown abort: after the last line of training, a process with gloo (and DDP) alive can
# be aborted while the interpreter exits (a worker thread needs a GIL that is going away; see pytorch
# PR 179291). Seen here on a loaded 2-core box about once in 40 runs of this script even with
# OMP_NUM_THREADS=1 (more often without it). The tool then does what it should: it names that rank and
# its signal. The test accepts exactly that, after every rank trained to the same parameters.
TEARDOWN_ABORT = re.compile(r"failed: rank \d+ on node-\d+ killed by signal 6: terminate called without an active "
                            r"exception$", re.M)


def torch_teardown_abort(proc) -> bool:
    return proc.returncode != 0 and bool(TEARDOWN_ABORT.search(proc.stderr))


def stop_node_sshd(cluster_name: str, index: int) -> None:
    """Kill the listening sshd of the cluster's ``index``-th namespace (the one its ct-init started),
    as a crashed sshd would leave the node: up, but not reachable over SSH."""
    from clustertool.providers.local import net, sysops

    ns = net.netns_name(cluster_name, index)

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])

    listener = [p for p in sysops.pids_in_netns([ns])[ns]
                if sysops.comm(p) == "sshd" and sysops.comm(parent(p)) == "ct-init"]
    assert len(listener) == 1, listener
    os.kill(listener[0], 15)
