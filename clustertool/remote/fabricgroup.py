"""A Fabric ``ThreadingGroup`` over the cluster's nodes, for users who script with Fabric.

Its connections hold the same trust as clustertool's own ssh: the cluster key only (no agent, no
~/.ssh keys), and the host keys pinned in the cluster's known_hosts, with paramiko's
``RejectPolicy``: a node whose key is not pinned, or differs from the pinned one, is refused.

The known_hosts file names each key by the node's ``HostKeyAlias`` (``<cluster>-node-K``, see
remote/keys.py and the ssh_config of remote/transport.py).  paramiko knows no HostKeyAlias: it
looks a key up by the host and port it connects to (``host``, or ``[host]:port`` off port 22), so
each pinned key is registered under that name on its own node's connection.  Nothing else (not
~/.ssh/known_hosts, not ~/.ssh/config) is read.  fabric and paramiko are imported here only,
when asked for a group.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from clustertool.core.errors import StateError
from clustertool.core.model import ClusterRecord, Node
from clustertool.core.state import ClusterPaths
from clustertool.remote import access
from clustertool.remote.transport import alias

if TYPE_CHECKING:  # fabric loads when a group is asked for (it has no type hints: Any to mypy)
    from fabric import Connection, ThreadingGroup

CONNECT_TIMEOUT = 10


def lookup_name(cluster: ClusterRecord, node: Node) -> str:
    """The name paramiko looks a host key up by for this node (the address it connects to)."""
    host = access.host_name(cluster, node)
    return host if node.ssh_port == 22 else f"[{host}]:{node.ssh_port}"


def pinned_lines(cluster: ClusterRecord, known_hosts: str) -> dict[str, list[str]]:
    """node name -> its pinned "keytype base64" lines, from known_hosts text keyed by HostKeyAlias."""
    by_alias = {alias(cluster.name, n): n.name for n in cluster.nodes}
    out: dict[str, list[str]] = {n.name: [] for n in cluster.nodes}
    for line in known_hosts.splitlines():
        parts = line.split()
        if len(parts) < 3 or line.lstrip().startswith(("#", "@")):
            continue
        for host in parts[0].split(","):
            if host in by_alias:
                out[by_alias[host]].append(f"{parts[1]} {parts[2]}")
    return out


def identities(cluster: ClusterRecord) -> list[str]:
    """The keys a connection may offer: the cluster key (and a static cluster's initial identity)."""
    keys = [str(ClusterPaths(cluster.name).key)]
    if cluster.ssh_key:
        keys.append(str(Path(cluster.ssh_key).expanduser()))
    return keys


def _pinned(conn: Connection, name: str, keys: list[str]) -> Connection:
    """Reject every host key but ``keys``, registered under ``name``."""
    import paramiko
    from paramiko.hostkeys import HostKeyEntry

    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    host_keys = conn.client.get_host_keys()
    for line in keys:
        entry = HostKeyEntry.from_line(f"{name} {line}")
        if entry is not None and entry.key is not None:  # a key type paramiko cannot read is left out
            host_keys.add(name, entry.key.get_name(), entry.key)
    return conn


def _bastion(cluster: ClusterRecord) -> Connection:
    """The user's --jump bastion: its pinned keys, the user's own keys and agent."""
    import paramiko
    from fabric import Config, Connection

    via = access.jump(cluster)
    assert via is not None  # only for a node whose hop is the --jump bastion (a member's gateway is the leader)
    conn = Connection(via.host, user=via.user, port=via.port, config=Config(ssh_config=paramiko.SSHConfig()),
                      connect_timeout=CONNECT_TIMEOUT)
    return _pinned(conn, via.host if via.port == 22 else f"[{via.host}]:{via.port}", cluster.jump_keys)


def _connection(cluster: ClusterRecord, node: Node, keys: list[str], gateway: Connection | None = None) -> Connection:
    """A pinned connection to ``node``; ``gateway`` is the connection it jumps through (the leader's,
    for a member behind it), else the bastion for a node reached through --jump."""
    import paramiko
    from fabric import Config, Connection

    if gateway is None and access.hop(cluster, node) is not None:
        gateway = _bastion(cluster)
    conn = Connection(access.host_name(cluster, node), user=cluster.user, port=node.ssh_port,
                      config=Config(ssh_config=paramiko.SSHConfig()), connect_timeout=CONNECT_TIMEOUT,
                      gateway=gateway,
                      connect_kwargs={"key_filename": identities(cluster), "look_for_keys": False,
                                      "allow_agent": False})
    return _pinned(conn, lookup_name(cluster, node), keys)


def _opened_once(conn: Connection) -> Connection:
    """A connection several threads open (its own, and the members' riding on it): one opens it."""
    lock, open_ = threading.Lock(), conn.open

    def open_once() -> object:
        with lock:
            return open_()
    conn.open = open_once
    return conn


def thread_group(cluster: ClusterRecord, nodes: list[Node]) -> ThreadingGroup:
    """A ``fabric.ThreadingGroup`` of ``nodes`` (leader first), pinned as the module says."""
    from fabric import ThreadingGroup

    path = ClusterPaths(cluster.name).known_hosts
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise StateError(f"cluster {cluster.name!r} has no pinned host keys ({path} is missing)",
                         hint=f"`clustertool repin -c {cluster.name}` pins them again") from None
    pinned = pinned_lines(cluster, text)
    ordered = [n for n in cluster.ordered_nodes() if n in nodes]
    leader = None
    if any(access.behind_leader(cluster, n) for n in ordered):  # one connection to the leader, shared
        leader = _opened_once(_connection(cluster, cluster.leader, pinned[cluster.leader.name]))
    conns = []
    for node in ordered:
        if node.is_leader and leader is not None:
            conns.append(leader)
        else:
            gateway = leader if access.behind_leader(cluster, node) else None
            conns.append(_connection(cluster, node, pinned[node.name], gateway))
    return ThreadingGroup.from_connections(conns)
