"""Cluster keys and pinned host keys, and wiring them onto every node.

* One key pair per cluster, made here, stored 0600 in the cluster's directory: ECDSA P-256
  (transport.KEYGEN_TYPE: the fast handshake), or what the provider needs (AWS: ed25519);
  clusters made before keep their ed25519 pair.
* Host keys are pinned per cluster: from the provider when it knows them (local nodes,
  AWS console output), else collected once on first contact (ssh-keyscan) and kept.
* ``wire_script``/``unwire_script`` are nodeprogs/wire.sh, sent on ssh's stdin (secrets never
  appear on a command line) that give every node the key, the pinned known_hosts of all
  nodes, and an ssh config block, so any node reaches any other non-interactively.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import subprocess
from pathlib import Path

from clustertool.core.errors import MissingPrerequisite, RemoteError
from clustertool.core.model import ClusterRecord, Node
from clustertool.core.state import ClusterPaths
from clustertool.nodeprogs import shell_script
from clustertool.remote import access
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import (
    KEX_PREFERENCE,
    KEYGEN_TYPE,
    Link,
    alias,
    leader_alias,
    write_ssh_config,
)


def keygen_argv(path: Path, comment: str, key_type: tuple[str, ...] = KEYGEN_TYPE) -> list[str]:
    return ["ssh-keygen", "-q", *key_type, "-N", "", "-C", comment, "-f", str(path)]


def ensure_keypair(cluster_name: str, key_type: tuple[str, ...] = KEYGEN_TYPE) -> ClusterPaths:
    """The cluster's key pair, made once: ``key_type`` (ssh-keygen's -t/-b) names its file, id_<type>."""
    paths = ClusterPaths(cluster_name)
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    if not paths.key.exists():
        try:
            subprocess.run(keygen_argv(paths.root / f"id_{key_type[1]}", f"clustertool-{cluster_name}", key_type),
                           check=True, capture_output=True)
        except FileNotFoundError:
            raise MissingPrerequisite("ssh-keygen not found",
                                      hint="install the OpenSSH client (apt-get install openssh-client)") from None
    os.chmod(paths.key, 0o600)
    return paths


def keyscan_argv(host: str, port: int, timeout: int = 5) -> list[str]:
    return ["ssh-keyscan", "-T", str(timeout), "-t", "ed25519,ecdsa,rsa", "-p", str(port), host]


def parse_keyscan(text: str) -> list[str]:
    """"type base64" lines of ssh-keyscan's (or ssh-keygen -F's) output."""
    keys = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            keys.append(f"{parts[1]} {parts[2]}")
    return keys


def keyscan(node: Node) -> list[str]:
    """Collect a node's host keys on first contact (trust on first use), "type base64" lines."""
    proc = subprocess.run(keyscan_argv(node.reach_host, node.ssh_port), capture_output=True, text=True)
    keys = parse_keyscan(proc.stdout)
    if not keys:
        raise RemoteError(f"{node.name} ({node.reach_host}:{node.ssh_port}): no host key could be collected",
                          hint="is sshd running and the port reachable from here?")
    return keys


def keyscan_via_leader(link: Link, nodes: list[Node]) -> None:
    """First contact with members behind the leader: the leader (pinned already) scans them on the
    cluster's private network, over the pinned connection to it."""
    cluster = link.record
    for node in nodes:
        line = " ".join(keyscan_argv(node.address, node.ssh_port))
        result = run_on_nodes(link, [cluster.leader], line, timeout=60).results[0]
        node.host_keys = parse_keyscan(result.stdout)
        if not node.host_keys:
            raise RemoteError(f"{node.name} ({node.address}:{node.ssh_port}): no host key could be collected "
                              f"through the leader ({result.reason or 'no key offered'})",
                              hint="is sshd running on it, and does the security group let the leader in?")


def known_hosts_argv(host: str, port: int, path: Path) -> list[str]:
    """ssh-keygen looking a host up in the user's own known_hosts (hashed entries too)."""
    return ["ssh-keygen", "-F", host if port == 22 else f"[{host}]:{port}", "-f", str(path)]


def pin_jump_keys(cluster: ClusterRecord) -> None:
    """The bastion's host keys, as the user already trusts them (~/.ssh/known_hosts); refused when absent."""
    via = access.jump(cluster)
    if via is None or cluster.jump_keys:
        return
    path = Path(os.path.expanduser("~")) / ".ssh" / "known_hosts"
    proc = subprocess.run(known_hosts_argv(via.host, via.port, path), capture_output=True, text=True)
    cluster.jump_keys = parse_keyscan(proc.stdout)
    if not cluster.jump_keys:
        raise RemoteError(f"--jump {via}: its host key is not in {path}, so it cannot be pinned",
                          hint=f"connect once with `ssh -p {via.port} {via.user}@{via.host}` and check the key")


def pin_host_keys(link: Link) -> None:
    """Make sure every node has pinned host keys (collecting them once where unknown): this machine
    scans the nodes it reaches directly, the leader those behind it."""
    cluster = link.record
    pin_jump_keys(cluster)
    for node in access.direct(cluster, cluster.nodes):
        if not node.host_keys:
            node.host_keys = keyscan(node)
    if any(access.jump(cluster) and not n.host_keys and not access.behind_leader(cluster, n)
           for n in cluster.nodes):
        raise RemoteError("nodes reached through --jump need host keys from the provider (none were given)")
    behind = [n for n in cluster.nodes if not n.host_keys]
    if behind:
        write_local_known_hosts(cluster)
        write_ssh_config(cluster)
        keyscan_via_leader(link, behind)


def fingerprint(host_keys: list[str]) -> str | None:
    """``SHA256:...`` of the first key line ("type base64 [comment]"), as ``ssh-keygen -l`` prints it;
    None when there is no key or it is not base64."""
    for line in host_keys:
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except (ValueError, binascii.Error):
            return None
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return None


def local_known_hosts(cluster: ClusterRecord) -> str:
    """known_hosts for this machine: keyed by the HostKeyAlias of each node."""
    lines = []
    for node in cluster.ordered_nodes():
        for key in node.host_keys:
            lines.append(f"{alias(cluster.name, node)} {key}")
    lines += [f"{access.jump_alias(cluster.name)} {key}" for key in cluster.jump_keys]
    return "\n".join(lines) + "\n"


def _host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def node_known_hosts(cluster: ClusterRecord) -> str:
    """known_hosts for the nodes themselves: private address, hostname and aliases."""
    lines = []
    for node in cluster.ordered_nodes():
        names = [_host_pattern(node.address, node.ssh_port), node.name, alias(cluster.name, node)]
        if node.is_leader:
            names.append(leader_alias(cluster.name))
        for key in node.host_keys:
            lines.append(f"{','.join(dict.fromkeys(names))} {key}")
    return "\n".join(lines) + "\n"


def write_local_known_hosts(cluster: ClusterRecord) -> Path:
    paths = ClusterPaths(cluster.name)
    paths.known_hosts.write_text(local_known_hosts(cluster))
    return paths.known_hosts


def node_ssh_config_block(cluster: ClusterRecord) -> str:
    """The block each node's ~/.ssh/config gets, so mpirun's plain `ssh ADDR` just works."""
    hosts = []
    for node in cluster.ordered_nodes():
        hosts += [node.address, node.name, alias(cluster.name, node)]
    hosts.append(leader_alias(cluster.name))
    return "\n".join([
        f"Host {' '.join(dict.fromkeys(hosts))}",
        f"  IdentityFile ~/.ssh/clustertool-{cluster.name}",
        f"  UserKnownHostsFile ~/.ssh/clustertool-{cluster.name}.known_hosts",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        f"  User {cluster.user}",
        "  KexAlgorithms @CT_KEX@",
    ]) + "\n"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def wire_script(cluster: ClusterRecord, private_key: str, public_key: str, hostfile: str | None) -> str:
    """Shell program (for stdin, nodeprogs/wire.sh) that gives a node the cluster key, host keys and config."""
    return shell_script(
        "wire", MODE="wire", NAME=cluster.name, PUBLIC=public_key.strip(), PRIVATE_B64=_b64(private_key),
        PUBLIC_B64=_b64(public_key), KNOWN_HOSTS_B64=_b64(node_known_hosts(cluster)),
        BLOCK_B64=_b64(node_ssh_config_block(cluster)), KEX=" ".join(KEX_PREFERENCE),
        HOSTFILE_B64=_b64(hostfile) if hostfile is not None else "")


def unwire_script(cluster: ClusterRecord, public_key: str) -> str:
    """Undo wire_script on a machine we do not own (static/adopted): remove only our traces."""
    return shell_script("wire", MODE="unwire", NAME=cluster.name, PUBLIC=public_key.strip())
