"""`up --access leader` on real sshd nodes: members refuse SSH from this machine (nftables in their
namespaces, as a security group would), and every command reaches them through the leader with
ProxyJump, host keys pinned on both hops, over one persistent connection to the leader."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = [pytest.mark.local,
              pytest.mark.skipif(not shutil.which("nft", path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")),
                                 reason="needs nft (apt-get install nftables; `make` installs it)")]


@pytest.fixture(scope="module")
def behind(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "acc", "--access", "leader")


def _paths(env, name):
    root = os.path.join(env["CLUSTERTOOL_HOME"], "clusters", name)
    return os.path.join(root, "ssh_config"), os.path.join(root, "known_hosts")


def _nodes(env, name) -> dict[str, str]:
    data = json.load(open(os.path.join(env["CLUSTERTOOL_HOME"], "clusters", f"{name}.json")))
    return {n["name"]: n["address"] for n in data["nodes"]}


def _close_masters(env, name):
    config, _ = _paths(env, name)
    for node in _nodes(env, name):
        subprocess.run(["ssh", "-F", config, "-O", "exit", f"{name}-{node}"], capture_output=True, timeout=30)


def _connect(address: str) -> str:
    try:
        socket.create_connection((address, 22), timeout=3).close()
        return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"unreachable ({exc})"


def _connections_to(address: str) -> int:
    out = subprocess.run(["ss", "-Htn", "state", "established", "dst", f"{address}:22"],
                         capture_output=True, text=True).stdout
    return len([line for line in out.splitlines() if line.strip()])


def test_members_refuse_ssh_from_this_machine_and_the_leader_takes_it(behind):
    name, env = behind
    nodes = _nodes(env, name)
    assert _connect(nodes["node-1"]) == "accepted"
    assert {_connect(nodes[n]) for n in ("node-2", "node-3", "node-4")} == {"refused"}
    config, _ = _paths(env, name)
    direct = subprocess.run(["ssh", "-F", config, "-o", "ProxyJump=none", "-o", "ControlPath=none",
                             f"{name}-node-3", "true"], capture_output=True, text=True, timeout=30)
    assert direct.returncode == 255 and "refused" in direct.stderr.lower()


def test_exec_reaches_every_node_through_one_connection_to_the_leader(behind):
    name, env = behind
    _close_masters(env, name)
    for _ in range(2):
        proc = run_cli("exec", "-c", name, "--json", "--", "hostname", env=env)
        assert proc.returncode == 0, proc.stderr
        results = json.loads(proc.stdout)["results"]
        assert sorted(r["stdout"].strip() for r in results) == ["node-1", "node-2", "node-3", "node-4"]
    nodes = _nodes(env, name)
    assert _connections_to(nodes["node-1"]) == 1  # the leader's ControlMaster, shared by every member's jump
    assert sum(_connections_to(nodes[n]) for n in ("node-2", "node-3", "node-4")) == 0


def test_copy_from_here_and_from_the_leader_lands_on_every_member(behind, tmp_path):
    name, env = behind
    src = tmp_path / "data"
    src.mkdir()
    blob = os.urandom(3 << 20)
    (src / "part.bin").write_bytes(blob)
    want = hashlib.sha256(blob).hexdigest()
    for args in (["--from", "local", str(src), "/scratch/acc"], ["/scratch/acc", "/scratch/acc2"]):
        proc = run_cli("copy", "-c", name, *args, env=env)
        assert proc.returncode == 0, proc.stderr
    for dest, holders in (("/scratch/acc/part.bin", range(1, 5)), ("/scratch/acc2/part.bin", range(2, 5))):
        proc = run_cli("exec", "-c", name, "--json", "--", "sha256sum", dest, env=env)
        sums = {r["node"]: r["stdout"].split()[0] for r in json.loads(proc.stdout)["results"] if r["stdout"]}
        assert sums == {f"node-{i}": want for i in holders}


def test_run_starts_ranks_on_every_member(behind):
    name, env = behind
    proc = run_cli("run", "-c", name, "--per-node", "1", "--follow", "--", "hostname", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {f"node-{i}" for i in range(1, 5)} <= {line.split(":")[-1].strip() for line in proc.stdout.splitlines()}


def test_ssh_to_a_member_by_name_and_by_plain_ssh_with_the_generated_config(behind, tmp_path):
    name, env = behind
    proc = run_cli("ssh", "-c", name, "node-2", "--", "hostname", env=env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "node-2"), proc.stderr
    config, _ = _paths(env, name)
    user_config = tmp_path / "config"  # what ~/.ssh/config's Include gives plain ssh
    user_config.write_text(f"Include {config}\n")
    plain = subprocess.run(["ssh", "-F", str(user_config), f"{name}-node-3", "hostname"],
                           capture_output=True, text=True, timeout=30)
    assert plain.stdout.strip() == "node-3", plain.stderr


def test_generated_config_jumps_through_the_leader_and_pins_both_hops(behind):
    name, env = behind
    config, known = _paths(env, name)
    text = open(config).read()
    assert text.count(f"ProxyJump {name}-leader") == 3
    assert "StrictHostKeyChecking yes" in text and "StrictHostKeyChecking no" not in text
    assert "stricthostkeychecking=no" not in text.lower().replace(" ", "=")
    pinned = {line.split()[0] for line in open(known)}
    assert pinned == {f"{name}-node-{i}" for i in range(1, 5)}
    exported = run_cli("inventory", "-c", name, "--format", "ssh-config", env=env).stdout
    assert f"ProxyJump {name}-leader" in exported and "StrictHostKeyChecking no" not in exported
    status = json.loads(run_cli("status", "-c", name, "--json", env=env).stdout)
    assert status["access"].startswith("leader") and all(n["reachable"] for n in status["nodes"])


def _swap_key(env, name, node, tmp_path) -> str:
    """Pin a stranger's key for ``node``; returns the known_hosts text to restore."""
    _, known = _paths(env, name)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / node)], check=True)
    fake = " ".join((tmp_path / f"{node}.pub").read_text().split()[:2])
    before = open(known).read()
    lines = [f"{name}-{node} {fake}" if ln.startswith(f"{name}-{node} ") else ln for ln in before.splitlines()]
    open(known, "w").write("\n".join(lines) + "\n")
    _close_masters(env, name)
    return before


def test_a_swapped_host_key_on_a_member_is_refused(behind, tmp_path):
    name, env = behind
    _, known = _paths(env, name)
    before = _swap_key(env, name, "node-3", tmp_path)
    try:
        proc = run_cli("exec", "-c", name, "--json", "--", "hostname", env=env)
        results = {r["node"]: r for r in json.loads(proc.stdout)["results"]}
        assert proc.returncode == 255
        assert "host key" in results["node-3"]["error"] and results["node-3"]["stdout"] == ""
        assert all(results[n]["exit_code"] == 0 for n in ("node-1", "node-2", "node-4"))
    finally:
        open(known, "w").write(before)


def test_a_swapped_host_key_on_the_leader_refuses_the_members_behind_it(behind, tmp_path):
    name, env = behind
    _, known = _paths(env, name)
    before = _swap_key(env, name, "node-1", tmp_path)
    try:
        proc = run_cli("exec", "-c", name, "--json", "--", "hostname", env=env)
        results = json.loads(proc.stdout)["results"]
        assert proc.returncode == 255 and all(r["stdout"] == "" and r["error"] for r in results)
    finally:
        open(known, "w").write(before)
    assert run_cli("exec", "-c", name, "--", "true", env=env).returncode == 0


def test_fabric_reaches_members_through_the_leader(behind):
    name, env = behind
    code = ("from clustertool import Cluster\n"
            f"with Cluster.load({name!r}).fabric() as g:\n"
            "    print(sorted(r.stdout.strip() for r in g.run('hostname', hide=True, in_stream=False).values()))\n")
    proc = subprocess.run([sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == str([f"node-{i}" for i in range(1, 5)]), proc.stderr


def test_stop_start_and_repin_keep_members_behind_the_leader(ct_env, local_cluster):
    name = local_cluster(2, "--access", "leader")
    member = _nodes(ct_env, name)["node-2"]
    assert run_cli("stop", "-c", name, env=ct_env).returncode == 0
    for step in (("start", "-c", name), ("repin", "-c", name)):
        proc = run_cli(*step, env=ct_env)
        assert proc.returncode == 0, proc.stderr
        assert _connect(member) == "refused"  # the namespace's rules outlive its processes, like a security group
        done = run_cli("exec", "-c", name, "--", "hostname", env=ct_env)
        assert done.returncode == 0 and "node-2: node-2" in done.stdout, done.stderr


def test_dry_run_plan_names_the_access_mode(ct_env):
    plan = run_cli("up", "--provider", "local", "-N", "3", "--name", "plan-acc", "--access", "leader", "--dry-run",
                   env=ct_env)
    assert plan.returncode == 0, plan.stderr
    assert "access: leader: node-1 takes SSH from this machine" in plan.stdout
    default = run_cli("up", "--provider", "local", "-N", "2", "--name", "plan-all", "--dry-run", env=ct_env).stdout
    assert "access: all: every node takes SSH from this machine" in default


@pytest.fixture
def bastion(ct_env, tmp_path):
    """The user's own bastion: a real sshd on this machine's loopback (its own host key and the user's
    key), with the user's ~/.ssh (a HOME of the test's own) knowing its host key, as after a first login.
    Yields (USER@HOST:PORT, its log, the environment with that HOME)."""
    env = dict(ct_env, HOME=str(tmp_path / "userhome"))
    home_ssh = os.path.join(env["HOME"], ".ssh")
    os.makedirs(home_ssh, mode=0o700, exist_ok=True)
    user_key = os.path.join(home_ssh, "id_ed25519")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", user_key], check=True)
    host_key = str(tmp_path / "bastion_host_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key], check=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "bastion_sshd_config"
    config.write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}", f"HostKey {host_key}", "PidFile none", "UsePAM no", "StrictModes no",
        f"AuthorizedKeysFile {user_key}.pub", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "AllowTcpForwarding yes", "LogLevel VERBOSE", ""]))
    log = tmp_path / "bastion.log"
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))
    try:
        for _ in range(100):
            if _connect_port("127.0.0.1", port):
                break
            time.sleep(0.05)
        pub = " ".join(open(host_key + ".pub").read().split()[:2])
        with open(os.path.join(home_ssh, "known_hosts"), "w") as known:
            known.write(f"[127.0.0.1]:{port} {pub}\n")
        yield f"root@127.0.0.1:{port}", log, env
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _connect_port(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_jump_reaches_the_leader_through_the_users_bastion_and_members_through_the_leader(ct_env, local_cluster,
                                                                                          bastion):
    jump, log, env = bastion
    name = local_cluster(3, "--access", "leader", "--jump", jump, env=env)
    config, known = _paths(ct_env, name)
    text = open(config).read()
    assert f"Host {name}-jump" in text and f"ProxyJump {name}-jump" in text and f"ProxyJump {name}-leader" in text
    assert f"{name}-jump ssh-ed25519 " in open(known).read()  # the bastion's key, pinned from ~/.ssh/known_hosts
    _close_masters(ct_env, name)
    subprocess.run(["ssh", "-F", config, "-O", "exit", f"{name}-jump"], capture_output=True, timeout=30)
    logins = lambda: open(log).read().count("Accepted publickey for root")  # noqa: E731
    before = logins()
    for _ in range(2):
        proc = run_cli("exec", "-c", name, "--json", "--", "hostname", env=env)
        assert proc.returncode == 0, proc.stderr
        results = json.loads(proc.stdout)["results"]
        assert sorted(r["stdout"].strip() for r in results) == ["node-1", "node-2", "node-3"]
    assert logins() - before == 1  # one persistent connection to the bastion carried every node's, twice
    leader = _nodes(ct_env, name)["node-1"]
    owners = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"{leader}:22"], capture_output=True,
                            text=True).stdout  # the bastion runs on this machine: its sshd holds the leg to the leader
    assert owners.strip() and all('(("sshd"' in line for line in owners.splitlines()), owners
    port = jump.rsplit(":", 1)[1]
    assert run_cli("down", "-c", name, "--yes", env=env).returncode == 0
    left = subprocess.run(["ss", "-Htn", "state", "established", "dst", f"127.0.0.1:{port}"], capture_output=True,
                          text=True).stdout
    assert left.strip() == ""  # down closed the persistent connection to the bastion too
