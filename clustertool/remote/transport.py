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
import subprocess
from pathlib import Path

from clustertool.model import Cluster, Node
from clustertool.remote import mux
from clustertool.state import ClusterPaths

CONTROL_PERSIST = "15m"

# Key exchange, fastest safe first. OpenSSH 9.0-9.8 default to sntrup761x25519, whose
# handshake costs ~4x the CPU of curve25519 (32 fresh connections on 2 cores: 1.4 s vs 0.36 s).
# ML-KEM hybrid (OpenSSH >= 9.9) is post-quantum AND fast, so it leads where available.
# CLUSTERTOOL_SSH_KEX overrides (e.g. sntrup761x25519-sha512@openssh.com to insist on PQ).
KEX_PREFERENCE = (
    "mlkem768x25519-sha256",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    "ecdh-sha2-nistp256",
)


@functools.lru_cache(maxsize=1)
def kex_algorithms() -> str | None:
    """KexAlgorithms for our ssh_config: the preference list filtered by what ssh supports."""
    if os.environ.get("CLUSTERTOOL_SSH_KEX"):
        return os.environ["CLUSTERTOOL_SSH_KEX"]
    try:
        supported = set(subprocess.run(["ssh", "-Q", "kex"], capture_output=True, text=True,
                                       timeout=10).stdout.split())
    except (OSError, subprocess.SubprocessError):
        return None
    chosen = [k for k in KEX_PREFERENCE if k in supported]
    return ",".join(chosen) or None


def alias(cluster_name: str, node: Node) -> str:
    """The ssh alias of a node: ``<cluster>-node-K``."""
    return f"{cluster_name}-{node.name}"


def leader_alias(cluster_name: str) -> str:
    return f"{cluster_name}-leader"


def render_ssh_config(cluster: Cluster, paths: ClusterPaths) -> str:
    """The cluster's ssh_config: one Host block per node, then shared settings."""
    lines = [f"# clustertool: cluster {cluster.name} (generated; rewritten by up/start)"]
    for node in cluster.ordered_nodes():
        names = [alias(cluster.name, node)]
        if node.is_leader:
            names.append(leader_alias(cluster.name))
        lines += [
            f"Host {' '.join(names)}",
            f"  HostName {node.reach_host}",
            f"  Port {node.ssh_port}",
            f"  HostKeyAlias {alias(cluster.name, node)}",
        ]
    identities = [str(paths.key)]
    if cluster.ssh_key:
        identities.append(str(Path(cluster.ssh_key).expanduser()))
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


def write_ssh_config(cluster: Cluster) -> Path:
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


class Transport:
    """How this machine runs a command on a node: argv for a pipeline, or a started process."""

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        raise NotImplementedError

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None) -> subprocess.Popen:
        """Start ``command`` on ``node``: output on pipes; a stdin pipe when ``stdin`` is given
        (the caller writes it).  Its own session, so a Ctrl-C reaches us, not every ssh."""
        return subprocess.Popen(
            self.argv(cluster_name, node, command, extra=extra),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


class SshTransport(Transport):
    """The real one: OpenSSH through the cluster's ssh_config.

    A command for a node whose ControlMaster runs goes straight to the master (remote/mux.py):
    no ssh process per node.  Otherwise (and with CLUSTERTOOL_NO_MUX set) ssh is spawned."""

    def argv(self, cluster_name: str, node: Node, command: str | None = None, *,
             extra: list[str] | None = None) -> list[str]:
        return ssh_argv(cluster_name, node, command, extra=extra)

    def spawn(self, cluster_name: str, node: Node, command: str, stdin: bytes | None, *,
              extra: list[str] | None = None):
        path = None if extra or os.environ.get("CLUSTERTOOL_NO_MUX") else master_socket(cluster_name, node)
        if path is not None and path.exists():
            try:
                return mux.MuxSession(path, command, stdin is not None)
            except mux.MuxError:
                pass  # a stale socket or a master going away: ssh sorts it out
        return super().spawn(cluster_name, node, command, stdin, extra=extra)


SSH = SshTransport()


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
