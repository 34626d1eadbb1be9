"""`up --shared-fs local` on real nodes: the leader's folder, mounted on every other node with sshfs (FUSE)
over the cluster's own key (the stand-in for EFS / FSx, which this kernel cannot mount).

One 4-node cluster for the module, its tests in order: a file one node writes is the file another reads;
it survives stop/start and a member's reboot; `copy` to it writes once, from the leader; `doctor`
finds a node that lost the mount and `repair-mounts` mounts it again; `down` leaves no FUSE mount
and no sshfs process anywhere on this machine.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.local.conftest import local_leftovers, module_cluster, sshfs_mounts

pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "sfs", "--shared-fs", "local")


def ct(env, *args):
    return run_cli(*args, env=env, timeout=120)


def on(env, name, nodes, command):
    """stdout of `command` on ``nodes``, as one text per node (exec --json)."""
    proc = ct(env, "exec", "-c", name, "-n", nodes, "--json", "--", command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["node"]: r["stdout"] for r in json.loads(proc.stdout)["results"]}


def mounts(env, name):
    proc = ct(env, "status", "-c", name, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["shared_fs"][0]["nodes"]


def test_a_file_written_on_node3_is_read_on_node1_and_every_node(shared):
    name, env = shared
    on(env, name, "node-3", "echo written-on-node-3 > /shared/hello")
    assert set(on(env, name, "all", "cat /shared/hello").values()) == {"written-on-node-3\n"}
    assert on(env, name, "node-2", "awk '$2==\"/shared\"{print $3}' /proc/self/mounts") == {"node-2": "fuse.sshfs\n"}
    assert mounts(env, name) == {f"node-{i}": "mounted" for i in range(1, 5)}


def test_it_survives_stop_and_start(shared):
    name, env = shared
    stop = ct(env, "stop", "-c", name)
    assert stop.returncode == 0 and "/shared: unmounted on node-[1-4]" in stop.stderr, stop.stderr
    start = ct(env, "start", "-c", name)
    assert start.returncode == 0, start.stderr
    assert "/shared: mounted on node-[1-4]" in start.stderr
    assert set(on(env, name, "all", "cat /shared/hello").values()) == {"written-on-node-3\n"}


def test_it_survives_a_members_reboot(shared):
    name, env = shared
    reboot = ct(env, "reboot", "-c", name, "--nodes", "node-2", "--yes")
    assert reboot.returncode == 0, reboot.stderr
    assert "/shared: mounted on node-2" in reboot.stderr
    on(env, name, "node-2", "echo after-reboot >> /shared/hello")
    assert on(env, name, "node-4", "cat /shared/hello") == {"node-4": "written-on-node-3\nafter-reboot\n"}


def test_copy_to_the_shared_mount_writes_once_from_the_leader(shared, tmp_path):
    name, env = shared
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "part-0").write_bytes(bytes(range(256)) * 400)
    proc = ct(env, "copy", "-c", name, "--from", "local", str(tmp_path / "ds"), "/shared/ds")
    assert proc.returncode == 0, proc.stderr
    assert "/shared/ds is on the shared filesystem /shared: written once, from the leader (node-1)" in proc.stderr
    assert "node-1" in proc.stdout and "node-2" not in proc.stdout and "node-4" not in proc.stdout
    sums = on(env, name, "all", "md5sum < /shared/ds/part-0")
    assert len(set(sums.values())) == 1 and len(sums) == 4


def test_run_syncs_code_to_the_shared_mount_once_and_every_rank_works_in_it(shared, tmp_path):
    name, env = shared
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "input.txt").write_text("from-the-laptop\n")
    proc = run_cli("run", "-c", name, "--per-node", "1", "--follow", "--sync", str(tmp_path / "code"),
                   "--sync-to", "/shared/code", "--workdir", "/shared/code", "--",
                   "sh", "-c", 'cp input.txt "out.$RANK"', env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "/shared/code is on the shared filesystem /shared: written once, from the leader (node-1)" in proc.stderr
    # each rank wrote into the one shared working directory: the leader sees all four files
    listing = on(env, name, "node-1", "cd /shared/code && cat out.0 out.1 out.2 out.3")
    assert listing == {"node-1": "from-the-laptop\n" * 4}


def test_doctor_names_a_node_that_lost_the_mount_and_repair_mounts_fixes_it(shared):
    name, env = shared
    ok = ct(env, "doctor", "-c", name, "--check", "shared-fs")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "[ok  ] shared-fs" in ok.stdout and "KiB write" in ok.stdout
    on(env, name, "node-4", "umount /shared")
    bad = ct(env, "doctor", "-c", name, "--check", "shared-fs")
    assert bad.returncode == 1
    assert "ERROR   shared-fs node-4: shared filesystem /shared is not mounted" in bad.stdout
    assert "clustertool repair-mounts" in bad.stdout
    assert mounts(env, name)["node-4"] == "missing"
    repair = ct(env, "repair-mounts", "-c", name)
    assert repair.returncode == 0, repair.stderr
    assert "/shared: mounted again on node-4" in repair.stdout
    assert "/shared: already mounted on node-[1-3]" in repair.stdout
    assert on(env, name, "node-4", "cat /shared/hello")["node-4"].startswith("written-on-node-3")
    assert ct(env, "doctor", "-c", name, "--check", "shared-fs").returncode == 0


def test_down_unmounts_and_leaves_no_fuse_mount_or_sshfs_process(shared):
    name, env = shared
    assert sshfs_mounts(name)  # the check below can see them: the members' mounts are there now
    down = ct(env, "down", "-c", name, "--yes")
    assert down.returncode == 0, down.stderr
    assert "/shared: unmounted on node-[1-4]" in down.stderr
    assert sshfs_mounts(name) == [] and local_leftovers(name) == []
