"""The foundation end to end, as a user runs it: up, exec, status, ssh wiring, down."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from clustertool.core import state
from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local


def test_exec_hostname_prints_every_node_and_down_leaves_nothing(ct_env, local_cluster):
    name = local_cluster(4)
    proc = run_cli("exec", "-c", name, "--", "hostname", env=ct_env)
    assert proc.returncode == 0, proc.stderr
    live = sorted(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if ": " in line)
    assert live == ["node-1", "node-2", "node-3", "node-4"]
    assert "4/4 ok [node-[1-4]]" in proc.stderr
    down = run_cli("down", "-c", name, "--yes", env=ct_env)
    assert down.returncode == 0, down.stderr
    assert local_leftovers(name) == []
    assert not state.exists(name)


def test_a_repeated_exec_goes_through_the_running_masters_and_says_what_ssh_says(ct_env, local_cluster):
    """Warm calls speak to each node's ControlMaster directly (remote/mux.py): no ssh process per
    node, same output and exit codes as spawning ssh (CLUSTERTOOL_NO_MUX), and down ends them."""
    from clustertool.remote.transport import master_socket

    name = local_cluster(3)
    cmd = ("exec", "-c", name, "--no-live", "--", "echo out-$(hostname); echo err >&2; exit $(hostname | cut -d- -f2)")
    with_ssh = run_cli(*cmd, env=dict(ct_env, CLUSTERTOOL_NO_MUX="1"))
    old = dict(os.environ)
    os.environ.update(ct_env)
    try:
        sockets = [master_socket(name, node) for node in state.load(name).nodes]
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert all(path.exists() for path in sockets)  # masters run: the next call goes through them
    through_master = run_cli(*cmd, env=ct_env)
    assert (through_master.returncode, through_master.stdout) == (with_ssh.returncode, with_ssh.stdout) == (
        3, with_ssh.stdout)
    assert "out-node-2" in through_master.stdout and "err" in through_master.stdout
    assert run_cli("down", "-c", name, "--yes", env=ct_env).returncode == 0
    assert not any(path.exists() for path in sockets) and local_leftovers(name) == []


def test_exit_code_is_the_highest_remote_one(ct_env, local_cluster):
    name = local_cluster(3)
    proc = run_cli("exec", "-c", name, "--", "exit $(hostname | cut -d- -f2)", env=ct_env)
    assert proc.returncode == 3


def test_identical_output_is_folded_by_node_set(ct_env, local_cluster):
    name = local_cluster(4)
    proc = run_cli("exec", "-c", name, "--nodes", "node-[1-2,4]", "--no-live", "--", "echo same", env=ct_env)
    assert "---- node-[1-2,4] (exit 0)\nsame\n" in proc.stdout
    assert "node-3" not in proc.stdout


def test_a_hung_node_times_out_with_255_and_the_rest_finish(ct_env, local_cluster):
    name = local_cluster(3)
    proc = run_cli("exec", "-c", name, "--timeout", "2", "--json", "--",
                   '[ "$(hostname)" = node-2 ] && sleep 60; echo done', env=ct_env)
    assert proc.returncode == 255
    results = {r["node"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["node-2"]["error"] == "timed out"
    assert results["node-1"]["stdout"] == "done\n" and results["node-3"]["exit_code"] == 0


def test_a_dead_node_is_reported_unreachable(ct_env, local_cluster):
    name = local_cluster(3)
    # pkill inside node-3 (its own PID namespace) stops only node-3's sshd
    run_cli("exec", "-c", name, "--nodes", "node-3", "--timeout", "10", "--", "pkill -x sshd", env=ct_env)
    subprocess.run(["ssh", "-F", str(state.ClusterPaths(name).ssh_config), "-O", "exit", f"{name}-node-3"],
                   capture_output=True)
    proc = run_cli("exec", "-c", name, "--timeout", "15", "--", "true", env=ct_env)
    assert proc.returncode == 255
    assert "node-3 (unreachable" in proc.stderr
    assert "2/3 ok [node-[1-2]]" in proc.stderr


def test_leader_has_hostfile_and_reaches_every_member_by_address(ct_env, local_cluster):
    name = local_cluster(3)
    c = state.load(name)
    addrs = [n.address for n in c.ordered_nodes()]
    script = "cat ~/hostfile; " + "; ".join(f"ssh {a} hostname" for a in addrs)
    proc = run_cli("exec", "-c", name, "--nodes", "leader", "--no-live", "--", script, env=ct_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [f"{a} slots=1" for a in addrs] == proc.stdout.splitlines()[1:4]
    assert proc.stdout.splitlines()[4:7] == ["node-1", "node-2", "node-3"]


def test_private_key_on_nodes_is_0600_and_known_hosts_pinned(ct_env, local_cluster):
    name = local_cluster(2)
    proc = run_cli("exec", "-c", name, "--nodes", "node-2", "--no-live", "--",
                   f"stat -c %a ~/.ssh/clustertool-{name}; "
                   f"grep -c ecdsa-sha2-nistp256 ~/.ssh/clustertool-{name}.known_hosts",
                   env=ct_env)
    assert proc.stdout.splitlines()[1:] == ["600", "2"]
    assert (state.ClusterPaths(name).key.stat().st_mode & 0o777) == 0o600


def test_every_handshake_is_p256_from_here_and_between_nodes(ct_env, local_cluster):
    """The cheap handshake (transport.KEX_PREFERENCE): P-256 key exchange, host key and user key."""
    name = local_cluster(2)
    paths = state.ClusterPaths(name)
    here = subprocess.run(["ssh", "-v", "-F", str(paths.ssh_config), "-o", "ControlMaster=no", "-o",
                           "ControlPath=none", f"{name}-node-2", "true"], capture_output=True, text=True, env=ct_env)
    between = run_cli("exec", "-c", name, "--nodes", "leader", "--no-live", "--", "ssh -v node-2 true 2>&1",
                      env=ct_env)
    for proc, log in ((here, here.stderr), (between, between.stdout)):
        assert proc.returncode == 0, log
        assert "kex: algorithm: ecdh-sha2-nistp256" in log
        assert "kex: host key algorithm: ecdsa-sha2-nistp256" in log
        assert re.search(r"Server accepts key: \S+ ECDSA ", log), log


def test_a_changed_host_key_is_refused_and_said(ct_env, local_cluster):
    name = local_cluster(2)
    paths = state.ClusterPaths(name)
    subprocess.run(["ssh", "-F", str(paths.ssh_config), "-O", "exit", f"{name}-node-2"], capture_output=True)
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(paths.root / "imposter")],
                           check=True)
    fake = (paths.root / "imposter.pub").read_text().split()[:2]
    lines = [ln if not ln.startswith(f"{name}-node-2 ") else f"{name}-node-2 {' '.join(fake)}"
             for ln in paths.known_hosts.read_text().splitlines()]
    paths.known_hosts.write_text("\n".join(lines) + "\n")
    proc = run_cli("exec", "-c", name, "--", "true", env=ct_env)
    assert proc.returncode == 255
    assert "host key CHANGED" in proc.stderr and "node-2" in proc.stderr
    assert other.returncode == 0


def test_status_json_reports_every_node_reachable(ct_env, local_cluster):
    name = local_cluster(3)
    proc = run_cli("status", "-c", name, "--json", env=ct_env)
    data = json.loads(proc.stdout)
    assert [(n["node"], n["role"], n["reachable"]) for n in data["nodes"]] == [
        ("node-1", "leader", True), ("node-2", "member", True), ("node-3", "member", True)]


def test_static_adopts_existing_machines_and_down_leaves_them_running(ct_env, local_cluster):
    base = local_cluster(2)
    c = state.load(base)
    adopted = unique("st")
    hosts = ",".join(n.address for n in c.ordered_nodes())
    up = run_cli("up", "--provider", "static", "--hosts", hosts, "--user", "root",
                 "--key", str(state.ClusterPaths(base).key), "--name", adopted, env=ct_env)
    assert up.returncode == 0, up.stderr
    proc = run_cli("exec", "-c", adopted, "--", "hostname", env=ct_env)
    assert proc.returncode == 0 and "node-2" in proc.stdout
    pub = state.ClusterPaths(adopted).pubkey.read_text().split()[1]
    assert run_cli("down", "-c", adopted, "--yes", env=ct_env).returncode == 0
    after = run_cli("exec", "-c", base, "--no-live", "--", f"grep -c {pub} ~/.ssh/authorized_keys; hostname",
                    env=ct_env)
    assert after.returncode == 0  # the adopted machines still answer
    assert "\n0\nnode-1\n" in after.stdout and "\n0\nnode-2\n" in after.stdout  # our key is gone


def test_nodes_share_the_hosts_software_like_an_image(ct_env, local_cluster):
    """The tool's own Python (a venv, a pyenv under /root) and checkout run on every node,
    although each node has a private /root and /tmp."""
    import sys

    import clustertool

    name = local_cluster(2)
    code = "import clustertool, numpy, sys; print(clustertool.__file__)"
    proc = run_cli("exec", "-c", name, "--no-live", "--", sys.executable, "-c", code, env=ct_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"---- node-[1-2] (exit 0)\n{clustertool.__file__}\n" in proc.stdout
    home = run_cli("exec", "-c", name, "--no-live", "--", "ls -A ~ | grep -c clustertool-marker || true",
                   env=ct_env)
    assert "0" in home.stdout  # homes stay private


def test_up_adds_an_include_so_plain_ssh_reaches_leader_and_nodes(ct_env, tmp_path):
    home = tmp_path / "userhome"
    home.mkdir()
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "config").write_text("Host example\n  User someone\n")
    # a clustertool home only root may write (this suite's own folders are under /tmp: no Include from there)
    safe = tempfile.mkdtemp(prefix="ct-test-home-", dir="/run")
    env = dict(ct_env, HOME=str(home), CLUSTERTOOL_HOME=safe)
    env.pop("CLUSTERTOOL_NO_SSH_INCLUDE")
    name = unique("inc")
    up = run_cli("up", "--provider", "local", "--nodes", "2", "--name", name, env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert "to ~/.ssh/config, so `ssh <cluster>-leader` works (CLUSTERTOOL_NO_SSH_INCLUDE=1" in up.stderr
        assert f"ssh:      ssh {name}-leader" in up.stdout
        config = (home / ".ssh" / "config").read_text()
        assert config.splitlines()[1].startswith("Include ") and "Host example" in config
        for alias, expected in ((f"{name}-leader", "node-1"), (f"{name}-node-2", "node-2")):
            proc = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), alias, "hostname"],
                                  capture_output=True, text=True, timeout=30)
            assert proc.stdout.strip() == expected, proc.stderr
        second = unique("inc")
        assert run_cli("up", "--provider", "local", "--nodes", "1", "--name", second, env=env).returncode == 0
        run_cli("down", "-c", second, "--yes", env=env)
        assert (home / ".ssh" / "config").read_text().count("Include ") == 1  # added once, not per cluster
    finally:
        run_cli("down", "-c", name, "--yes", env=env)
        shutil.rmtree(safe, ignore_errors=True)
    assert local_leftovers(name) == []
    assert (home / ".ssh" / "config").read_text() == "Host example\n  User someone\n"  # the last cluster took it


def test_a_home_under_tmp_gets_no_include_and_up_says_what_works(ct_env, tmp_path):
    home = tmp_path / "userhome"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    env = dict(ct_env, HOME=str(home))  # CLUSTERTOOL_HOME: under /tmp, as this suite's are
    env.pop("CLUSTERTOOL_NO_SSH_INCLUDE")
    name = unique("tmp")
    up = run_cli("up", "--provider", "local", "--nodes", "1", "--name", name, env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert "~/.ssh/config not edited: /tmp is writable by other users" in up.stderr
        assert f"ssh:      clustertool ssh -c {name}" in up.stdout and not (home / ".ssh" / "config").exists()
    finally:
        run_cli("down", "-c", name, "--yes", env=env)
    assert local_leftovers(name) == []


def test_past_32_nodes_up_checks_the_leader_by_sample_and_banner_and_a_dead_sshd_is_named(ct_env, local_cluster):
    from clustertool.cluster.session import ClusterSession
    from clustertool.cluster.wiring import check_leader_mesh
    from clustertool.core.errors import RemoteError
    from clustertool.remote.mesh import leader_targets

    name = local_cluster(40)  # up itself ran the sampled check against 40 real nodes
    cluster = state.load(name)
    by_ssh, by_banner = leader_targets(cluster.nodes)
    assert "node-20" in {n.name for n in by_banner} and len(by_ssh) < 10
    run_cli("exec", "-c", name, "--nodes", "node-20", "--timeout", "10", "--", "pkill -x sshd", env=ct_env)
    with pytest.raises(RemoteError) as err:
        check_leader_mesh(ClusterSession(cluster))
    assert err.value.message.startswith("the leader cannot ssh to node-20: cannot connect to port 22")
