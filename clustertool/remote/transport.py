"""One-node SSH transport: the cluster's ssh_config and the argv that uses it.

Everything goes through the OpenSSH client with a per-cluster config file: pinned host
keys (StrictHostKeyChecking yes, never no), the cluster key, and ControlMaster
multiplexing so repeated commands reuse one authenticated connection per node.

``Transport`` is the seam: whatever runs commands on nodes (``run_on_nodes`` and what builds
on it) takes one, ``SSH`` by default; tests hand in a scripted one (tests/fakes/transport.py).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Protocol

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from clustertool.core.state import ClusterPaths
from clustertool.remote import access, mux
from clustertool.remote.access import alias, leader_alias

__all__ = ["alias", "leader_alias"]  # named here for the modules that import them from the transport

CONTROL_PERSIST = "15m"

# The handshake profile: NIST P-256 throughout (ECDH key exchange, ECDSA host and user keys).
# OpenSSH 9.2 computes curve25519 and ed25519 with its own portable reference code, but P-256
# with OpenSSL's optimised code: 64 fresh connections to 64 local nodes on 2 cores cost
# 1.57 CPU-s with curve25519 + ed25519 keys, 1.29 with only the key exchange on P-256 and 1.20
# (-24%) with keys and key exchange on P-256 -- the cost of a cold `exec` on a big cluster.
# P-256 is as strong as curve25519 (~128-bit), FIPS-approved and in OpenSSH's own defaults.
# ML-KEM hybrid (OpenSSH >= 9.9) is post-quantum, so it still leads where available;
# sntrup761x25519 (9.0-9.8's default) costs ~4x the CPU of curve25519 and comes after.
# CLUSTERTOOL_SSH_KEX overrides (e.g. sntrup761x25519-sha512@openssh.com to insist on PQ).
KEX_PREFERENCE = (
    "mlkem768x25519-sha256",
    "ecdh-sha2-nistp256",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
)

# ssh-keygen's arguments for the keys clustertool makes (the cluster key, local nodes' host keys).
KEYGEN_TYPE = ("-t", "ecdsa", "-b", "256")

# Host key algorithms in the order a node's pinned keys are used; a key type names the
# signature algorithms it can make (an RSA key signs with SHA-2, never SHA-1).
HOST_KEY_PREFERENCE = (
    ("ecdsa-sha2-nistp256", ("ecdsa-sha2-nistp256",)),
    ("ssh-ed25519", ("ssh-ed25519",)),
    ("ecdsa-sha2-nistp384", ("ecdsa-sha2-nistp384",)),
    ("ecdsa-sha2-nistp521", ("ecdsa-sha2-nistp521",)),
    ("ssh-rsa", ("rsa-sha2-512", "rsa-sha2-256")),
)


@functools.lru_cache(maxsize=None)
def _ssh_supports(query: str) -> frozenset[str]:
    try:
        return frozenset(subprocess.run(["ssh", "-Q", query], capture_output=True, text=True,
                                        timeout=10).stdout.split())
    except (OSError, subprocess.SubprocessError):
        return frozenset()


@functools.lru_cache(maxsize=1)
def kex_algorithms() -> str | None:
    """KexAlgorithms for our ssh_config: the preference list filtered by what ssh supports."""
    if os.environ.get("CLUSTERTOOL_SSH_KEX"):
        return os.environ["CLUSTERTOOL_SSH_KEX"]
    chosen = [k for k in KEX_PREFERENCE if k in _ssh_supports("kex")]
    return ",".join(chosen) or None


def host_key_algorithms(host_keys: list[str]) -> str | None:
    """HostKeyAlgorithms for a node: only the algorithms of its pinned keys, P-256 first.

    None (ssh's own order) when no key is pinned yet or a pinned type is not in the list.
    """
    types = {key.split()[0] for key in host_keys if key.split()}
    known = {t for t, _ in HOST_KEY_PREFERENCE}
    if not types or not types <= known:
        return None
    supported = _ssh_supports("HostKeyAlgorithms")
    chosen = [alg for t, algs in HOST_KEY_PREFERENCE if t in types for alg in algs
              if not supported or alg in supported]
    return ",".join(chosen) or None


def render_ssh_config(cluster: ClusterRecord, paths: ClusterPaths) -> str:
    """The cluster's ssh_config: one Host block per node, then shared settings."""
    lines = [f"# clustertool: cluster {cluster.name} (generated; rewritten by up/start); "
             f"access: {access.describe(cluster)}"]
    for node in cluster.ordered_nodes():
        names = [alias(cluster.name, node)]
        if node.is_leader:
            names.append(leader_alias(cluster.name))
        lines += [
            f"Host {' '.join(names)}",
            f"  HostName {access.host_name(cluster, node)}",
            f"  Port {node.ssh_port}",
            f"  HostKeyAlias {alias(cluster.name, node)}",
        ]
        algorithms = host_key_algorithms(node.host_keys)
        if algorithms:
            lines.append(f"  HostKeyAlgorithms {algorithms}")
        via = access.hop(cluster, node)
        if via:
            lines.append(f"  ProxyJump {via}")
    identities = [str(paths.key)]
    if cluster.ssh_key:
        identities.append(str(Path(cluster.ssh_key).expanduser()))
    lines += access.jump_block(cluster, _own_identities())
    lines += [
        f"Host {cluster.name}-*",
        f"  User {cluster.user}",
        *[f"  IdentityFile {ident}" for ident in identities],
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {paths.known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        "  ControlMaster auto",
        f"  ControlPath {paths.control_dir}/%C",
        f"  ControlPersist {CONTROL_PERSIST}",
        "  ConnectTimeout 10",
        "  ServerAliveInterval 15",
        "  ServerAliveCountMax 4",
        "  LogLevel ERROR",
    ]
    kex = kex_algorithms()
    if kex:
        lines.append(f"  KexAlgorithms {kex}")
    return "\n".join(lines) + "\n"


def _own_identities() -> list[str]:
    """The user's own default keys, offered to their bastion (with their agent)."""
    home = Path(os.path.expanduser("~")) / ".ssh"
    return [str(home / name) for name in ("id_ed25519", "id_ecdsa", "id_rsa") if (home / name).exists()]


def write_ssh_config(cluster: ClusterRecord) -> Path:
    paths = ClusterPaths(cluster.name)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths.ssh_config.write_text(render_ssh_config(cluster, paths))
    return paths.ssh_config


def ssh_argv(cluster_name: str, node: Node, command: str | None = None, *,
             tty: bool = False, extra: list[str] | None = None) -> list[str]:
    """argv for ssh to one node through the cluster's config.

    ``command`` is a remote shell command line: callers quote user values with shlex.
    """
    paths = ClusterPaths(cluster_name)
    argv = ["ssh", "-F", str(paths.ssh_config)]
    argv += ["-t"] if tty else ["-T"]
    argv += list(extra or [])
    argv += ["--", alias(cluster_name, node)]  # "--": a command starting with "-" stays a command
    if command is not None:
        argv.append(command)
    return argv


def session_argv(cluster_name: str, node: Node, command: str | None = None, *, tty: bool = False) -> list[str]:
    """ssh_argv for an interactive session (`ssh`, `attach`), its jump host's ControlMaster opened first."""
    warm_jump(cluster_name, alias(cluster_name, node))
    return ssh_argv(cluster_name, node, command, tty=tty)


class NodeProcess(Protocol):
    """A command started on a node, as the fan-out uses it: a local ssh (``subprocess.Popen``) or
    a session on a running master (``mux.MuxSession``, no local process)."""

    @property
    def stdin(self) -> IO[bytes] | None: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    @property
    def stderr(self) -> IO[bytes] | None: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class Transport:
    """How this machine runs a command on a node: argv for a pipeline, or a started process."""

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        raise NotImplementedError

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None) -> NodeProcess:
        """Start ``command`` on ``node``: output on pipes; a stdin pipe when ``stdin`` is given
        (the caller writes it).  Its own session, so a Ctrl-C reaches us, not every ssh."""
        return subprocess.Popen(
            self.argv(cluster_name, node, command, extra=extra),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


class SshTransport(Transport):
    """The real one: OpenSSH through the cluster's ssh_config.

    A command for a node whose ControlMaster runs goes straight to the master (remote/mux.py):
    no ssh process per node.  Otherwise (and with CLUSTERTOOL_NO_MUX set) ssh is spawned.  A node
    reached through a jump (ProxyJump in the config) gets its jump host's ControlMaster opened
    first, so every connection through it rides on one persistent, authenticated connection
    instead of each fan-out opening its own."""

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        if "-O" not in (extra or []):
            warm_jump(cluster_name, alias(cluster_name, node))
        return ssh_argv(cluster_name, node, command, extra=extra)

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None) -> NodeProcess:
        path = None if extra or os.environ.get("CLUSTERTOOL_NO_MUX") else master_socket(cluster_name, node)
        if path is not None and path.exists():
            try:
                return mux.MuxSession(path, command, stdin is not None)
            except mux.MuxError:
                pass  # a stale socket or a master going away: ssh sorts it out
        return super().spawn(cluster_name, node, command, stdin, extra=extra)


SSH = SshTransport()


class Link:
    """One cluster as this machine reaches it: its record (nodes, ssh_config, keys, host aliases)
    and the transport that runs commands on its nodes.  Every function that reaches nodes takes a
    Link; the cluster session (cluster/session.py) is one, and tests hand in a scripted transport
    (clustertool.remote.testing), as Fabric's tests hand a Connection a fake."""

    def __init__(self, record: ClusterRecord, transport: Transport = SSH) -> None:
        self.record = record
        self.transport = transport

    @property
    def name(self) -> str:
        return self.record.name

    def reload(self) -> ClusterRecord:
        """Read the record again (another command may have changed it); returns it."""
        self.record = state.load(self.name)
        return self.record

    def ready(self) -> ClusterRecord:
        """The record, which must be up and wired for SSH (every command that runs on nodes)."""
        return state.require_ready(self.record)

    def argv(self, node: Node, command: str | None = None, *, extra: list[str] | None = None) -> list[str]:
        return self.transport.argv(self.name, node, command, extra=extra)

    def spawn(self, node: Node, command: str, stdin: bytes | None, *, extra: list[str] | None = None) -> NodeProcess:
        return self.transport.spawn(self.name, node, command, stdin, extra=extra)


WARM_FOR = 60.0  # seconds a checked jump master counts as open without asking ssh again
_warm: dict[tuple[str, str], float] = {}
_warm_lock = threading.Lock()


def proxy_jumps(config_text: str) -> dict[str, str]:
    """alias -> its ProxyJump alias, from an ssh_config we rendered (one Host block per node)."""
    jumps: dict[str, str] = {}
    names: list[str] = []
    for line in config_text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "Host":
            names = words[1:]
        elif len(words) == 2 and words[0] == "ProxyJump":
            jumps.update({name: words[1] for name in names})
    return jumps


def master_argv(cluster_name: str, host_alias: str) -> list[str]:
    """argv that makes sure ``host_alias``'s ControlMaster runs: a no-op command through it (with
    ControlMaster auto and ControlPersist, the first connection stays as the master)."""
    return ["ssh", "-F", str(ClusterPaths(cluster_name).ssh_config), "-T", "--", host_alias, "true"]


def warm_jump(cluster_name: str, host_alias: str) -> None:
    """Open the ControlMaster of the host ``host_alias`` jumps through (and of its own jump, first)."""
    try:
        target = proxy_jumps(ClusterPaths(cluster_name).ssh_config.read_text()).get(host_alias)
    except OSError:
        return
    if target is None:
        return
    warm_jump(cluster_name, target)
    with _warm_lock:
        if time.monotonic() - _warm.get((cluster_name, target), -WARM_FOR) < WARM_FOR:
            return
        try:  # a jump host that does not answer: the node's own connection then says why
            ok = subprocess.run(master_argv(cluster_name, target), stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            _warm[(cluster_name, target)] = time.monotonic()


def forget_warm(cluster_name: str) -> None:
    """The cluster's ControlMasters were closed: the next jump opens its master again."""
    with _warm_lock:
        for key in [k for k in _warm if k[0] == cluster_name]:
            del _warm[key]


@functools.lru_cache(maxsize=32)
def _config_user(config: str, mtime_ns: int) -> str | None:
    for line in Path(config).read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "User":
            return parts[1]
    return None


def master_socket(cluster_name: str, node: Node) -> Path | None:
    """Where this node's ControlMaster listens (ControlPath %C of the cluster's ssh_config)."""
    paths = ClusterPaths(cluster_name)
    try:
        user = _config_user(str(paths.ssh_config), paths.ssh_config.stat().st_mtime_ns)
    except OSError:
        return None
    return mux.control_path(paths.control_dir, node.reach_host, node.ssh_port, user) if user else None


def control_exit_argv(cluster_name: str, node: Node) -> list[str]:
    """argv that closes a node's ControlMaster, if one runs."""
    return ssh_argv(cluster_name, node, extra=["-O", "exit"])


def classify_ssh_failure(stderr: str) -> str | None:
    """Turn ssh's own stderr into a one-line reason, or None when it was the command's."""
    text = stderr.lower()
    if "remote host identification has changed" in text or "host key verification failed" in text:
        if "has changed" in text:
            return ("host key CHANGED: refusing to connect (the node was rebuilt, or someone is "
                    "in the middle); check, then `clustertool repin --nodes NODE`")
        return "host key not pinned or does not match: refusing to connect"
    for marker, reason in (
        ("connection refused", "unreachable: connection refused"),
        ("connection timed out", "unreachable: connection timed out"),
        ("no route to host", "unreachable: no route to host"),
        ("network is unreachable", "unreachable: network is unreachable"),
        ("could not resolve hostname", "unreachable: could not resolve host name"),
        ("permission denied", "authentication failed (permission denied)"),
        ("connection closed by", "unreachable: connection closed during setup"),
        ("kex_exchange_identification", "unreachable: connection closed during setup"),
        ("operation timed out", "unreachable: connection timed out"),
    ):
        if marker in text:
            return reason
    return None


def stop_process(proc: NodeProcess) -> None:
    """Stop a node's command: its ssh's process group, or a session on a master (remote/mux.py,
    no local process: ending the control connection closes the channel)."""
    if not isinstance(proc, subprocess.Popen):
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
