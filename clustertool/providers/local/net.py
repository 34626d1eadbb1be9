"""Pure builders for the local provider: names, addresses, argv lists and file texts.

Nothing here touches the system; every function returns data (argv lists, ``ip -batch``
/ ``tc -batch`` lines, config text) so it can be unit-tested.

Addressing: cluster slot ``k`` (0..250, chosen system-wide) owns ``10.213.k.0/24``; node
``i`` is ``10.213.k.i`` for i = 1..254, every usable address of the /24.  The bridge
``ctbr<k>`` (this machine's side) sits outside it, at ``10.213.255.<k+1>/32``, with a route
to the slot's /24 through the bridge; each node has the matching /32 route back.  Nothing
is ever routed outside ``10.213.0.0/16``: nodes have no default route and the host keeps an
``unreachable`` route for the whole range while any local cluster exists.

Neighbours are static: every node's eth0 and every bridge get a MAC address made from the slot
and index, and each node knows all its peers' (and the bridge's) addresses from the start, as
this machine knows every node's, so nothing is resolved by ARP.  Hundreds of nodes resolving
each other by broadcast on one bridge flood the kernel's per-CPU packet backlog
(netdev_max_backlog), which then drops ARP and SYN packets: "No route to host" between healthy
nodes.  IPv6 link-local addresses are not made (no multicast either).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

NET_PREFIX = "10.213"
NET_RANGE = f"{NET_PREFIX}.0.0/16"
MAX_SLOT = 250
MAX_NODES = 254  # .1 .. .254: the whole /24 (the bridge's address is in 10.213.255.0/24)
BRIDGE_NET = 255  # the third octet of the bridges' addresses (slots stop at MAX_SLOT = 250)
BRIDGE_RE = re.compile(r"^ctbr(\d{1,3})$")
NODE_IFACE = "eth0"
SSHD = "/usr/sbin/sshd"

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_RATE_FACTORS = {
    "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
}
_DELAY_FACTORS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


# ---- names and addresses -------------------------------------------------------------

def bridge_name(slot: int) -> str:
    return f"ctbr{slot}"


def veth_name(slot: int, index: int) -> str:
    """Host side of node ``index``'s veth; at most 9 characters (IFNAMSIZ is 16)."""
    return f"ct{slot}n{index}"


def netns_name(cluster: str, index: int) -> str:
    return f"ct-{cluster}-{index}"


def veth_pattern(slot: int) -> re.Pattern[str]:
    return re.compile(rf"^ct{slot}n(\d+)$")


def netns_pattern(cluster: str) -> re.Pattern[str]:
    """Matches exactly the namespace names :func:`netns_name` makes for ``cluster``."""
    return re.compile(rf"^ct-{re.escape(cluster)}-(\d+)$")


def node_address(slot: int, index: int) -> str:
    return f"{NET_PREFIX}.{slot}.{index}"


def bridge_address(slot: int) -> str:
    """This machine's address on a slot's bridge: outside the slot's /24, so all 254 are nodes'."""
    return f"{NET_PREFIX}.{BRIDGE_NET}.{slot + 1}"


def node_mac(slot: int, index: int) -> str:
    """A node's eth0 MAC: locally administered (02:...), made from slot and index."""
    return f"02:c7:{slot:02x}:00:00:{index:02x}"


def bridge_mac(slot: int) -> str:
    return f"02:c7:{slot:02x}:00:01:00"


def subnet(slot: int) -> str:
    return f"{NET_PREFIX}.{slot}.0/24"


def first_free_slot(used: set[int]) -> int | None:
    for slot in range(MAX_SLOT + 1):
        if slot not in used:
            return slot
    return None


def slots_in_use(link_names: list[str]) -> set[int]:
    return {int(m.group(1)) for m in map(BRIDGE_RE.match, link_names) if m}


# ---- link option parsing ------------------------------------------------------------

def rate_bits(rate: str) -> int:
    """'200mbit' -> 200_000_000 bits/s; ValueError on anything tc would not take."""
    m = _RATE_RE.match(rate.strip().lower())
    if not m:
        raise ValueError(f"not a rate: {rate!r} (expected e.g. 200mbit, 1gbit, 10mbps)")
    bits = int(float(m.group(1)) * _RATE_FACTORS[m.group(2)])
    if bits < 8000:
        raise ValueError(f"rate {rate!r} is below 8kbit")
    return bits


def delay_seconds(delay: str) -> float:
    """'5ms' -> 0.005; ValueError on anything tc would not take."""
    m = _DELAY_RE.match(delay.strip().lower())
    if not m:
        raise ValueError(f"not a delay: {delay!r} (expected e.g. 5ms, 200us, 1s)")
    return float(m.group(1)) * _DELAY_FACTORS[m.group(2)]


def tbf_burst_bytes(bits_per_s: int) -> int:
    """Bucket size: ~10 ms worth of data, at least a few full-size (64 KiB GSO) packets."""
    return max(bits_per_s // 8 // 100, 3 * 65536)


# ---- ip / tc batch lines ------------------------------------------------------------

def ip_batch_argv(netns: str | None = None, force: bool = False) -> list[str]:
    """``ip [-n NS] [-force] -batch -``: read commands from stdin (one process for many)."""
    argv = ["ip"]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    return argv + ["-batch", "-"]


def tc_batch_argv(netns: str | None = None, force: bool = False) -> list[str]:
    argv = ["tc"]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    return argv + ["-batch", "-"]


def link_tag(cluster: str, token: str) -> str:
    """Alias set on the links a cluster makes: terminate removes only links carrying it."""
    return f"clustertool:{cluster}:{token}"


def bridge_alias(tag: str, home: str, cluster_id: str) -> str:
    """The bridge's alias: the cluster's link tag plus who made it (home id) and the cluster id,
    so a sweep removes only its own home's lost clusters."""
    return f"{tag}:{home}:{cluster_id or '-'}"


def carries(alias: str, tag: str) -> bool:
    """Whether a link's alias is ``tag`` (veths) or ``tag`` with an owner after it (the bridge)."""
    return alias == tag or alias.startswith(tag + ":")


def bridge_lines(slot: int, alias: str) -> list[str]:
    br = bridge_name(slot)
    return [
        f"link add {br} address {bridge_mac(slot)} type bridge",
        f"link set {br} alias {alias}",
        f"link set {br} addrgenmode none",
        f"addr add {bridge_address(slot)}/32 dev {br}",
        f"link set {br} up",
        f"route add {subnet(slot)} dev {br} src {bridge_address(slot)}",
    ]


def host_node_lines(cluster: str, slot: int, index: int, tag: str) -> list[str]:
    """Host-side lines for one node: its namespace and a veth whose peer is its eth0."""
    ns, veth = netns_name(cluster, index), veth_name(slot, index)
    return [
        f"netns add {ns}",
        f"link add {veth} type veth peer name {NODE_IFACE} address {node_mac(slot, index)} netns {ns}",
        f"link set {veth} alias {tag}",
        f"link set {veth} addrgenmode none",
        f"link set {veth} master {bridge_name(slot)}",
        f"link set {veth} up",
        f"neigh replace {node_address(slot, index)} lladdr {node_mac(slot, index)} dev {bridge_name(slot)} "
        "nud permanent",
    ]


def node_lines(slot: int, index: int, count: int) -> list[str]:
    """Lines run inside the node's namespace (``ip -n NS -batch -``): its address in the slot's
    /24, a /32 route to the bridge (this machine), no default route; and the MAC of every other
    node of the cluster (1..count) and of the bridge, so nothing is resolved by broadcast."""
    lines = [
        "link set lo up",
        f"link set {NODE_IFACE} addrgenmode none",
        f"addr add {node_address(slot, index)}/24 dev {NODE_IFACE}",
        f"link set {NODE_IFACE} up",
        f"route add {bridge_address(slot)}/32 dev {NODE_IFACE}",
        f"neigh replace {bridge_address(slot)} lladdr {bridge_mac(slot)} dev {NODE_IFACE} nud permanent",
    ]
    return lines + [f"neigh replace {node_address(slot, j)} lladdr {node_mac(slot, j)} dev {NODE_IFACE} nud permanent"
                    for j in range(1, count + 1) if j != index]


def teardown_lines(netns: list[str], veths: list[str], bridge: str | None) -> list[str]:
    """Lines for ``ip -force -batch -``: each may fail (already gone) without stopping the rest."""
    lines = [f"netns del {ns}" for ns in netns]
    lines += [f"link del {veth}" for veth in veths]
    if bridge:
        lines.append(f"link del {bridge}")
    return lines


def route_add_argv() -> list[str]:
    """Keep 10.213.0.0/16 from ever leaving the machine (the bridges' /24 routes win)."""
    return ["ip", "route", "replace", "unreachable", NET_RANGE]


def route_del_argv() -> list[str]:
    return ["ip", "route", "del", "unreachable", NET_RANGE]


def route_show_argv() -> list[str]:
    return ["ip", "route", "show", "type", "unreachable", NET_RANGE]


def bridges_argv() -> list[str]:
    return ["ip", "-o", "link", "show", "type", "bridge"]


def shaping_lines(dev: str, rate: str | None, delay: str | None) -> list[str]:
    """``tc -batch`` lines shaping egress of ``dev``.

    delay and rate: netem (delay) at the root with a tbf child (rate); rate only: tbf at
    the root; delay only: netem alone.  Nothing: no lines.
    """
    lines: list[str] = []
    tbf = ""
    if rate:
        bits = rate_bits(rate)
        tbf = f"tbf rate {bits}bit burst {tbf_burst_bytes(bits)} latency 100ms"
    if delay:
        delay_seconds(delay)  # validates
        lines.append(f"qdisc replace dev {dev} root handle 1: netem delay {delay} limit 100000")
        if rate:
            lines.append(f"qdisc replace dev {dev} parent 1:1 handle 10: {tbf}")
    elif rate:
        lines.append(f"qdisc replace dev {dev} root handle 1: {tbf}")
    return lines


def netem_probe_argv() -> list[str]:
    """Try a netem qdisc on ``lo`` of a throw-away namespace: does this kernel have netem?"""
    return ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]


# ---- processes ----------------------------------------------------------------------

def sshd_argv(config_path: Path) -> list[str]:
    return [SSHD, "-D", "-e", "-f", str(config_path)]


def node_start_argv(netns: str, python: str, init_script: Path, config_path: Path) -> list[str]:
    """Enter the node's netns, then new UTS/mount/PID namespaces with the reaper as PID 1.

    ``--kill-child`` makes the reaper (and so the whole PID namespace) die with unshare.
    """
    return [
        "ip", "netns", "exec", netns,
        "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
        "--propagation", "private", "--kill-child",
        python, "-I", "-S", str(init_script), str(config_path),
    ]



# What a node's processes inherit from the machine that starts them: a fresh machine's little, not
# the caller's environment (which may hold AWS keys or tokens that a node must never carry).
NODE_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


def node_environment(host_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in host_env.items() if k in NODE_ENV_KEEP}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env

# ---- files --------------------------------------------------------------------------

NODE_ETC_SSH = Path("/etc/ssh")  # each node sees its own /etc/ssh (host key, sshd_config)
HOST_KEY = "ssh_host_ecdsa_key"  # the node's one host key, made by keys.keygen_argv (P-256)
NODE_BOOT = "/root/.clustertool/boot.sh"  # run by the node's init at every start (the autostop watcher's loop)
# every *.sh there, too, in name order (a program installed on the node that must come back with it: Slurm's
# start script, slurm/nodescript.py); boot.sh stays the autostop watcher's own
NODE_BOOT_DIR = "/root/.clustertool/boot.d"
# A node powers itself off by ending its sshd: init (PID 1) then exits and the kernel ends every
# process of the node's PID namespace -- what `stop` does, seen from inside.
NODE_POWEROFF = f'kill -TERM "$(cat {NODE_ETC_SSH / "sshd.pid"})"'


def sshd_config_text(address: str, title: str) -> str:
    """sshd_config for one node (paths as the node sees them): key auth only, room for fan-out."""
    return "\n".join([
        f"# {title} -- written by clustertool's local provider",
        f"ListenAddress {address}:22",
        f"HostKey {NODE_ETC_SSH / HOST_KEY}",
        f"PidFile {NODE_ETC_SSH / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes yes",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "MaxSessions 64",
        "MaxStartups 100:30:200",
        "LoginGraceTime 30",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        "",
    ])


def hosts_text(names_addresses: list[tuple[str, str]]) -> str:
    """/etc/hosts seen inside every node, so node names resolve within the cluster, and addresses to names:
    also as a dual-stack socket sees them (``::ffff:10.213.k.i``: PyTorch's store listens on [::] and names
    each peer, and a node has no DNS that answers)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{addr}\t{name}" for name, addr in names_addresses]
    lines += [f"::ffff:{addr}\t{name}" for name, addr in names_addresses]
    return "\n".join(lines) + "\n"


PRIVATE_DIRS = ("/root", "/scratch", "/tmp")


def shared_software(paths: list[str]) -> list[str]:
    """Of ``paths`` (host software locations), those hidden by a node's private dirs.

    Nested ones are dropped (binding the outer directory carries them).
    """
    hidden = sorted({os.path.normpath(p) for p in paths
                     if any(os.path.normpath(p).startswith(d + "/") for d in PRIVATE_DIRS)})
    return [p for p in hidden if not any(p != q and p.startswith(q + "/") for q in hidden)]


def init_config(hostname: str, node_dir: Path, hosts_file: Path, shared: Sequence[str] = ()) -> dict:
    """What the node's PID 1 (init.py) does: hostname, private mounts, then sshd.

    Host directories under ``node_dir`` are bound over /root, /scratch, /tmp and /etc/ssh;
    the cluster's hosts file over /etc/hosts; a fresh tmpfs on /dev/shm; then ``shared``
    host paths (software under those private dirs) are bound back at their own paths.
    """
    return {
        "shared": list(shared),
        "hostname": hostname,
        "binds": [
            [str(node_dir / "home"), "/root"],
            [str(node_dir / "scratch"), "/scratch"],
            [str(node_dir / "tmp"), "/tmp"],
            [str(node_dir / "ssh"), str(NODE_ETC_SSH)],
            [str(hosts_file), "/etc/hosts"],
        ],
        "tmpfs": [["/dev/shm", "mode=1777"]],
        "command": sshd_argv(NODE_ETC_SSH / "sshd_config"),
        "boot": NODE_BOOT,
        "boot_dir": NODE_BOOT_DIR,
    }
