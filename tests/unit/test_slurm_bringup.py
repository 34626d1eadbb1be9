"""Slurm's bring-up with the nodes scripted (tests/local/test_slurm.py runs it on real local nodes): the
munge key only on stdin, the controller before the other nodes, mixed releases refused, a node that
never becomes idle named; and the programs it sends are valid shell."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from clustertool.core.model import ClusterRecord, Node
from clustertool.remote.testing import Reply, ScriptedTransport
from clustertool.remote.transport import Link
from clustertool.slurm import SlurmError, bringup, munge, nodescript
from clustertool.slurm.bringup import parse_probe
from clustertool.slurm.layout import private_layout

pytestmark = pytest.mark.unit

SIZE_LINE = "NodeName=x CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
IDLE = "".join(f"node-{i}|workers*|idle|gpu:2|2|24105|none\n" for i in (1, 2, 3))
KEY = bytes(range(128))


def mode(name: str):
    """Matches the node program run in mode ``name`` (its header sets MODE=...; the comments name every mode)."""
    return lambda call: f"\nMODE={name}\n" in (call.stdin or "")


def cluster(tmp_path, versions=("22.05.8",) * 3):
    nodes = [Node(f"node-{i}", i, f"10.213.9.{i}", role="leader" if i == 1 else "member") for i in (1, 2, 3)]
    fake = ScriptedTransport(tmp_path)
    for node, version in zip(nodes, versions):
        fake.on(mode("probe"), Reply(stdout=f"size {SIZE_LINE}\nversion slurm-wlm {version}\ngpus 2\n"), node=node.name)
    fake.on(mode("install"), Reply(stdout="started\n"))
    return Link(ClusterRecord("team", "local", nodes=nodes), fake), fake


def test_the_key_travels_only_on_stdin_and_the_controller_starts_first(tmp_path):
    link, fake = cluster(tmp_path)
    fake.on("sinfo", Reply(stdout=IDLE)).on("srun", Reply())
    settings = bringup.setup(link, KEY, standin_gpus=2)
    assert settings.node_names == ["node-1", "node-2", "node-3"] and [n.gpus for n in settings.nodes] == [2, 2, 2]
    installs = [c for c in fake.calls if mode("install")(c)]
    assert [c.node for c in installs][0] == "node-1" and sorted(c.node for c in installs[1:]) == ["node-2", "node-3"]
    encoded = munge.key_b64(KEY)
    assert all(encoded in (c.stdin or "") and c.command == "sh -s" for c in installs)
    assert not [c for c in fake.calls if encoded in c.command or KEY.hex() in c.command]
    assert not [c for c in fake.calls if encoded in (c.stdin or "") and not mode("install")(c)]
    srun = [c.command for c in fake.calls if "srun" in c.command]
    assert srun == ["env SLURM_CONF=/root/.clustertool/slurm/etc/slurm.conf "
                    "srun --nodes=3 --kill-on-bad-exit=1 -- true"]


def test_setup_returns_only_once_the_nodes_are_idle_again_after_its_srun(tmp_path):
    """srun's job ends with its nodes `completing` for a while (longer on a loaded machine): a job sent at once
    found them not idle.  setup asks sinfo again after the srun, until every node is idle."""
    link, fake = cluster(tmp_path)
    ran = []
    completing = IDLE.replace("|idle|", "|completing|")
    fake.on("srun", Reply(effect=lambda call: ran.append(call)))
    fake.on(lambda call: "sinfo" in call.command and bool(ran), Reply(stdout=completing), times=2)
    fake.on("sinfo", Reply(stdout=IDLE))
    bringup.setup(link, KEY, standin_gpus=2)
    after = [c for c in fake.calls[fake.calls.index(ran[0]) + 1:] if "sinfo" in c.command]
    assert len(after) == 3   # completing, completing, idle


def test_nodes_running_different_releases_are_refused_before_anything_starts(tmp_path):
    link, fake = cluster(tmp_path, versions=("22.05.8", "23.11.4", "23.11.4"))
    releases = r"different Slurm releases \(22\.05\.8 on node-1, 23\.11\.4 on node-\[2-3\]\)"
    with pytest.raises(SlurmError, match=releases):
        bringup.setup(link, KEY)
    assert not [c for c in fake.calls if mode("install")(c)]


def test_a_node_without_slurm_is_named(tmp_path):
    link, fake = cluster(tmp_path)
    fake.rules.clear()
    fake.on(mode("probe"), Reply(stdout="error: slurmd is not installed on node-2\n", code=4), node="node-2")
    fake.on(mode("probe"), Reply(stdout=f"size {SIZE_LINE}\nversion slurm 22.05.8\ngpus 0\n"))
    with pytest.raises(SlurmError, match="^the Slurm probe failed on node-2: slurmd is not installed on node-2$"):
        bringup.setup(link, KEY)


def test_a_node_that_never_gets_idle_is_named_with_its_state_and_where_to_look(tmp_path):
    link, fake = cluster(tmp_path)
    fake.on("sinfo", Reply(stdout=IDLE.replace("node-3|workers*|idle|gpu:2|2|24105|none",
                                               "node-3|workers*|down*|gpu:2|2|24105|Not responding")))
    with pytest.raises(SlurmError, match=r"^node-3 not idle in Slurm: node-3 is down\* \(Not responding\)$") as err:
        bringup.setup(link, KEY, timeout=0.5)
    assert err.value.hint == ("see /root/.clustertool/slurm/log/slurmd.log on node-3 and "
                              "/root/.clustertool/slurm/log/slurmctld.log on node-1")


def test_the_cluster_key_is_made_once_0600_and_kept(tmp_path):
    key = munge.ensure_key(tmp_path)
    path = tmp_path / "munge.key"
    assert len(key) == munge.KEY_BYTES and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert munge.ensure_key(tmp_path) == key
    os.chmod(path, 0o640)
    with pytest.raises(SlurmError, match="can be read by others"):
        munge.ensure_key(tmp_path)


def test_munged_never_uses_the_machines_own_munge_folders():
    argv = munge.munged_argv(private_layout())
    assert argv[0] == "munged" and not [a for a in argv if "/etc/munge" in a or "/run/munge" in a]
    assert "--socket=/tmp/.clustertool-slurm/munge.socket" in argv
    assert "--key-file=/root/.clustertool/slurm/munge/munge.key" in argv


@pytest.mark.parametrize("script", [
    nodescript.probe_script(private_layout(), 2),
    nodescript.install_script(private_layout(), {"slurm.conf": "x=1\n"}, KEY, "#!/bin/sh\n", start=True,
                              standin_gpus=2),
    nodescript.start_script(private_layout()),
    nodescript.stop_script(private_layout()),
    nodescript.start_script_text(private_layout(), "node-1", controller=True, compute=True, standin=True),
], ids=["probe", "install", "start", "stop", "start.sh"])
def test_the_node_programs_are_valid_shell(script):
    assert subprocess.run(["sh", "-n"], input=script.encode()).returncode == 0
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "--format=gcc", "--shell=sh", "-"], input=script.encode(),
                              capture_output=True)
        assert proc.returncode == 0, proc.stdout.decode()


def test_stand_in_gpus_are_refused_outside_a_local_node(tmp_path):
    """On this machine (PID 1 is not a local node's ct-init) the script must not touch /dev."""
    before = sorted(os.listdir("/dev"))
    proc = subprocess.run(["sh", "-s"], input=nodescript.standin_text(2), capture_output=True, text=True)
    assert proc.returncode == 3 and "only on local-provider nodes" in proc.stdout
    assert sorted(os.listdir("/dev")) == before


def test_the_probe_reads_size_release_and_gpus():
    text = ("size " + SIZE_LINE + "\nversion slurm-wlm 22.05.8\ngpus 2\n")
    probe = parse_probe("node-2", text)
    assert (probe.node, probe.size.cpus, probe.version, probe.gpus) == ("node-2", 2, (22, 5, 8), 2)
    with pytest.raises(SlurmError, match="node-2: the Slurm probe said"):
        parse_probe("node-2", "error: slurmd is not installed on node-2\n")
