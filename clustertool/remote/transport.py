"""One-node SSH transport: the cluster's ssh_config and the argv that uses it.

Everything goes through the OpenSSH client with a per-cluster config file: pinned host
keys (StrictHostKeyChecking yes, never no), the cluster key, and ControlMaster
multiplexing so repeated commands reuse one authenticated connection per node.
"""

from __future__ import annotations

from pathlib import Path

from clustertool.model import Cluster, Node
from clustertool.state import ClusterPaths

CONTROL_PERSIST = "15m"


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
        "",
    ]
    return "\n".join(lines)


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
