"""The local provider's pure builders: names, addresses, ip/tc batch lines, argv, config text."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clustertool.providers.local import net
from clustertool.remote import keys

pytestmark = pytest.mark.unit


def test_names_fit_linux_interface_name_limit_even_at_the_largest_slot_and_node():
    assert net.veth_name(250, 253) == "ct250n253"
    assert len(net.veth_name(250, 253)) <= 15
    assert net.bridge_name(250) == "ctbr250"


def test_addresses_give_nodes_the_whole_slot_subnet_and_the_bridge_an_address_outside_it():
    assert net.node_address(7, 3) == "10.213.7.3" and net.node_address(7, 254) == "10.213.7.254"
    assert net.MAX_NODES == 254
    assert net.bridge_address(7) == "10.213.255.8" and net.bridge_address(net.MAX_SLOT) == "10.213.255.251"
    assert net.subnet(7) == "10.213.7.0/24"
    assert all(not net.bridge_address(s).startswith(f"10.213.{s}.") for s in range(net.MAX_SLOT + 1))


def test_netns_pattern_matches_only_this_clusters_namespaces():
    pattern = net.netns_pattern("demo")
    assert pattern.match(net.netns_name("demo", 12))
    assert not pattern.match("ct-demo-x-1")  # cluster "demo-x" is another cluster
    assert not pattern.match("ct-demo2-1")
    assert not pattern.match("ct-demo-")


def test_veth_pattern_does_not_match_another_slots_veths():
    pattern = net.veth_pattern(1)
    assert pattern.match("ct1n4")
    assert not pattern.match("ct11n4")
    assert not pattern.match("ctbr1")


def test_first_free_slot_fills_gaps_and_reports_exhaustion():
    assert net.first_free_slot(set()) == 0
    assert net.first_free_slot({0, 1, 3}) == 2
    assert net.first_free_slot(set(range(net.MAX_SLOT + 1))) is None


def test_slots_in_use_reads_only_clustertool_bridges():
    assert net.slots_in_use(["ctbr0", "ctbr12", "docker0", "br0", "ctbrx", "ct0n1", "ctbr1234"]) == {0, 12}


@pytest.mark.parametrize("text,bits", [
    ("200mbit", 200_000_000), ("1gbit", 10**9), ("10mbps", 80_000_000), ("64kbit", 64_000),
    ("1.5Mbit", 1_500_000),
])
def test_rate_bits_understands_tc_units(text, bits):
    assert net.rate_bits(text) == bits


@pytest.mark.parametrize("text", ["fast", "200", "200mb", "-1mbit", "1kbit", "200 mbit; rm -rf /"])
def test_rate_bits_rejects_what_tc_would_not_take(text):
    with pytest.raises(ValueError):
        net.rate_bits(text)


@pytest.mark.parametrize("text,seconds", [("5ms", 0.005), ("200us", 0.0002), ("1s", 1.0), ("2.5ms", 0.0025)])
def test_delay_seconds_understands_tc_units(text, seconds):
    assert net.delay_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "5 ms", "5min", "ms", "5ms\nqdisc del dev eth0 root"])
def test_delay_seconds_rejects_garbage(text):
    with pytest.raises(ValueError):
        net.delay_seconds(text)


def test_batch_argv_reads_stdin_optionally_inside_a_namespace():
    assert net.ip_batch_argv() == ["ip", "-batch", "-"]
    assert net.ip_batch_argv("ct-a-1") == ["ip", "-n", "ct-a-1", "-batch", "-"]
    assert net.ip_batch_argv(force=True) == ["ip", "-force", "-batch", "-"]
    assert net.tc_batch_argv("ct-a-1") == ["tc", "-n", "ct-a-1", "-batch", "-"]


def test_bridge_lines_create_tag_address_and_raise_the_bridge():
    assert net.bridge_lines(3, "clustertool:a:ff") == [
        "link add ctbr3 address 02:c7:03:00:01:00 type bridge",
        "link set ctbr3 alias clustertool:a:ff",
        "link set ctbr3 addrgenmode none",
        "addr add 10.213.255.4/32 dev ctbr3",
        "link set ctbr3 up",
        "route add 10.213.3.0/24 dev ctbr3 src 10.213.255.4",
    ]


def test_host_node_lines_make_namespace_and_veth_with_eth0_inside():
    assert net.host_node_lines("a", 3, 2, "clustertool:a:ff") == [
        "netns add ct-a-2",
        "link add ct3n2 type veth peer name eth0 address 02:c7:03:00:00:02 netns ct-a-2",
        "link set ct3n2 alias clustertool:a:ff",
        "link set ct3n2 addrgenmode none",
        "link set ct3n2 master ctbr3",
        "link set ct3n2 up",
        "neigh replace 10.213.3.2 lladdr 02:c7:03:00:00:02 dev ctbr3 nud permanent",
    ]


def test_node_lines_raise_lo_and_address_eth0_without_a_default_route():
    lines = net.node_lines(3, 2, 3)
    assert lines[:5] == ["link set lo up", "link set eth0 addrgenmode none", "addr add 10.213.3.2/24 dev eth0",
                         "link set eth0 up", "route add 10.213.255.4/32 dev eth0"]
    assert not any("default" in line for line in lines)


def test_every_node_knows_its_peers_and_the_bridge_by_mac_so_nothing_is_broadcast():
    lines = net.node_lines(3, 2, 254)
    neigh = [ln for ln in lines if ln.startswith("neigh replace")]
    assert len(neigh) == 254  # 253 peers and the bridge, none for itself
    assert "neigh replace 10.213.255.4 lladdr 02:c7:03:00:01:00 dev eth0 nud permanent" in neigh
    assert "neigh replace 10.213.3.254 lladdr 02:c7:03:00:00:fe dev eth0 nud permanent" in neigh
    assert not any(" 10.213.3.2 " in ln for ln in neigh)
    macs = {net.node_mac(s, i) for s in (0, 250) for i in range(1, 255)} | {net.bridge_mac(0), net.bridge_mac(250)}
    assert len(macs) == 2 * 254 + 2 and all(m.startswith("02:") for m in macs)


def test_teardown_lines_delete_namespaces_then_links_then_bridge():
    assert net.teardown_lines(["ct-a-1"], ["ct3n1"], "ctbr3") == [
        "netns del ct-a-1", "link del ct3n1", "link del ctbr3"]
    assert net.teardown_lines([], [], None) == []


def test_route_argv_guards_the_whole_range_idempotently():
    assert net.route_add_argv() == ["ip", "route", "replace", "unreachable", "10.213.0.0/16"]
    assert net.route_del_argv() == ["ip", "route", "del", "unreachable", "10.213.0.0/16"]
    assert net.route_show_argv() == ["ip", "route", "show", "type", "unreachable", "10.213.0.0/16"]


def test_shaping_rate_only_is_a_root_tbf():
    lines = net.shaping_lines("ct0n1", "10mbit", None)
    assert len(lines) == 1
    assert lines[0].startswith("qdisc replace dev ct0n1 root handle 1: tbf rate 10000000bit burst ")
    assert "latency" in lines[0]


def test_shaping_delay_and_rate_is_netem_root_with_tbf_child():
    lines = net.shaping_lines("eth0", "200mbit", "5ms")
    assert lines[0] == "qdisc replace dev eth0 root handle 1: netem delay 5ms limit 100000"
    assert lines[1].startswith("qdisc replace dev eth0 parent 1:1 handle 10: tbf rate 200000000bit ")


def test_shaping_delay_only_is_netem_alone_and_nothing_is_no_lines():
    assert net.shaping_lines("eth0", None, "5ms") == [
        "qdisc replace dev eth0 root handle 1: netem delay 5ms limit 100000"]
    assert net.shaping_lines("eth0", None, None) == []


def test_shaping_refuses_bad_values_instead_of_building_a_tc_line():
    with pytest.raises(ValueError):
        net.shaping_lines("eth0", "lots", None)
    with pytest.raises(ValueError):
        net.shaping_lines("eth0", None, "soon")


def test_tbf_burst_covers_ten_milliseconds_and_at_least_three_gso_packets():
    assert net.tbf_burst_bytes(10_000_000) == 3 * 65536
    assert net.tbf_burst_bytes(10_000_000_000) == 10_000_000_000 // 8 // 100


def test_netem_probe_runs_in_a_throwaway_namespace():
    argv = net.netem_probe_argv()
    assert argv[:2] == ["unshare", "--net"]
    assert "netem" in argv


def test_host_keys_are_unencrypted_p256_keys_made_quietly(tmp_path):
    key = tmp_path / net.HOST_KEY
    proc = subprocess.run(keys.keygen_argv(key, "demo-node-1"), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == ""
    assert (tmp_path / f"{net.HOST_KEY}.pub").read_text().split()[::2] == ["ecdsa-sha2-nistp256", "demo-node-1"]
    assert "ENCRYPTED" not in key.read_text()


def test_sshd_argv_stays_in_foreground_logging_to_stderr():
    assert net.sshd_argv(Path("/etc/ssh/sshd_config")) == [
        "/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"]


def test_node_start_argv_enters_netns_then_new_uts_mount_pid_namespaces_with_the_reaper():
    argv = net.node_start_argv("ct-a-1", "/usr/bin/python3", Path("/p/local_init.py"), Path("/n/init.json"))
    assert argv[:4] == ["ip", "netns", "exec", "ct-a-1"]
    unshare = argv[4:argv.index("/usr/bin/python3")]
    assert unshare[0] == "unshare"
    for flag in ("--uts", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"):
        assert flag in unshare
    assert unshare[unshare.index("--propagation") + 1] == "private"
    assert argv[-4:] == ["-I", "-S", "/p/local_init.py", "/n/init.json"]


def test_sshd_config_is_key_only_root_with_room_for_fan_out():
    text = net.sshd_config_text("10.213.3.2", "demo node-2")
    lines = set(text.splitlines())
    for expected in ("ListenAddress 10.213.3.2:22", "PermitRootLogin prohibit-password",
                     "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
                     "StrictModes yes", "AuthorizedKeysFile .ssh/authorized_keys",
                     "MaxSessions 64", "MaxStartups 100:30:200",
                     "HostKey /etc/ssh/ssh_host_ecdsa_key", "PidFile /etc/ssh/sshd.pid"):
        assert expected in lines
    assert not any(line.startswith("PermitRootLogin yes") for line in lines)


def test_hosts_text_names_every_node_and_localhost():
    text = net.hosts_text([("node-1", "10.213.0.1"), ("node-2", "10.213.0.2")])
    assert "127.0.0.1\tlocalhost" in text.splitlines()
    assert "10.213.0.2\tnode-2" in text.splitlines()


def test_hosts_text_names_the_ipv4_mapped_addresses_a_dual_stack_socket_sees():
    # PyTorch's TCPStore listens on [::]: it sees a node as ::ffff:10.213.0.2 and asks its name; without this
    # line the lookup went to DNS and every rank printed "[c10d] The hostname of the client socket cannot be
    # retrieved. err=-3"
    text = net.hosts_text([("node-1", "10.213.0.1"), ("node-2", "10.213.0.2")])
    assert "::ffff:10.213.0.2\tnode-2" in text.splitlines() and "::ffff:10.213.0.1\tnode-1" in text.splitlines()


def test_init_config_binds_private_dirs_over_the_node_view_and_runs_sshd():
    config = net.init_config("node-2", Path("/c/node-2"), Path("/c/hosts"))
    assert config["hostname"] == "node-2"
    targets = {target: source for source, target in config["binds"]}
    assert targets == {"/root": "/c/node-2/home", "/scratch": "/c/node-2/scratch",
                       "/tmp": "/c/node-2/tmp", "/etc/ssh": "/c/node-2/ssh", "/etc/hosts": "/c/hosts"}
    assert config["tmpfs"] == [["/dev/shm", "mode=1777"]]
    assert config["command"] == ["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"]


# ---- LocalProvider.check(): fails fast, in one line, before anything is made ----------------

from clustertool.core.errors import MissingPrerequisite, UsageError  # noqa: E402
from clustertool.core.model import ClusterRecord  # noqa: E402
from clustertool.providers.base import ProvisionRequest  # noqa: E402
from clustertool.providers.local import local_provider  # noqa: E402


def _request(count: int = 3, **options) -> ProvisionRequest:
    cluster = ClusterRecord(name="unit-local", provider="local", options=options)
    return ProvisionRequest(cluster=cluster, count=count, slots=None, public_key="ssh-ed25519 AAAA x",
                            key_path=Path("/nonexistent/key"), files_dir=Path("/nonexistent"))


@pytest.fixture
def as_root_with_tools(monkeypatch):
    monkeypatch.setattr(local_provider.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_provider, "_which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(local_provider.sysops, "netns_list", lambda: [])


def test_check_as_non_root_says_root_is_needed_in_one_line(monkeypatch):
    monkeypatch.setattr(local_provider.os, "geteuid", lambda: 1000)
    request = _request()
    with pytest.raises(MissingPrerequisite) as info:
        local_provider.LocalProvider().check(request)
    assert "root" in info.value.message and "\n" not in info.value.message
    assert request.cluster.provider_state == {}


def test_check_names_missing_programs_and_their_apt_packages(monkeypatch):
    monkeypatch.setattr(local_provider.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_provider, "_which", lambda tool: None if tool in ("/usr/sbin/sshd", "tc") else tool)
    with pytest.raises(MissingPrerequisite) as info:
        local_provider.LocalProvider().check(_request())
    message = info.value.message
    assert "/usr/sbin/sshd" in message and "tc" in message
    assert "openssh-server" in message and "iproute2" in message
    assert "\n" not in message


@pytest.mark.parametrize("count", [0, -1, 255])
def test_check_refuses_node_counts_outside_the_subnet(as_root_with_tools, count):
    with pytest.raises(UsageError) as info:
        local_provider.LocalProvider().check(_request(count=count))
    assert str(count) in info.value.message


@pytest.mark.parametrize("options,key", [({"link_rate": "fast"}, "link_rate"), ({"link_delay": "soon"}, "link_delay")])
def test_check_names_the_bad_link_option(as_root_with_tools, options, key):
    with pytest.raises(UsageError) as info:
        local_provider.LocalProvider().check(_request(**options))
    assert info.value.message.startswith(f"option {key}:")


def test_plan_describes_namespaces_addresses_sshd_and_shaping():
    lines = local_provider.LocalProvider().plan(_request(count=4, link_rate="200mbit"))
    text = "\n".join(lines)
    assert "node-1..node-4" in text and "ct-unit-local-<i>" in text and "10.213.<k>.<i>" in text
    assert "sshd" in text and "rate 200mbit" in text


def test_software_under_private_dirs_is_shared_back_outermost_only():
    from clustertool.providers.local.net import shared_software

    assert shared_software(["/tmp/ck/.venv", "/tmp/ck", "/root/.pyenv/versions/3.11", "/usr", "/work/x"]) == [
        "/root/.pyenv/versions/3.11", "/tmp/ck"]


def test_a_private_dir_itself_is_never_shared_back():
    from clustertool.providers.local.net import shared_software

    assert shared_software(["/root", "/tmp", "/scratch/"]) == []


def test_nodes_start_with_a_fresh_machines_environment_not_the_callers_credentials():
    host = {"PATH": "/p", "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SESSION_TOKEN": "t", "GITHUB_TOKEN": "g", "HOME": "/root", "CLUSTERTOOL_HOME": "/x"}
    assert net.node_environment(host) == {"PATH": "/p", "LANG": "C.UTF-8"}
    assert "PATH" in net.node_environment({})


def test_a_node_launcher_outside_any_namespace_is_found_by_its_config_path(tmp_path):
    """teardown's second net: a node whose launcher has not (or no longer) a netns of ours is still
    found by the init.json it was started with, and only ours are."""
    import subprocess

    from clustertool.providers.local import sysops

    ours, other = tmp_path / "a" / "local", tmp_path / "b" / "local"
    procs = [subprocess.Popen(["sh", "-c", "sleep 30", "ct-node", str(d / "node-2" / "init.json")])
             for d in (ours, other)]
    try:
        found = sysops.pids_starting_nodes_of(ours)
        assert procs[0].pid in found and procs[1].pid not in found
        assert sysops.pids_starting_nodes_of(tmp_path / "a") == []  # the nodes dir itself, not a prefix
    finally:
        for p in procs:
            p.kill()
            p.wait()
