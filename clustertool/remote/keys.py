"""Cluster keys and pinned host keys, and wiring them onto every node.

* One ed25519 key pair per cluster, made here, stored 0600 in the cluster's directory.
* Host keys are pinned per cluster: from the provider when it knows them (local nodes,
  AWS console output), else collected once on first contact (ssh-keyscan) and kept.
* ``wire_script``/``unwire_script`` are shell programs sent on ssh's stdin (secrets never
  appear on a command line) that give every node the key, the pinned known_hosts of all
  nodes, and an ssh config block, so any node reaches any other non-interactively.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
from pathlib import Path

from clustertool.errors import MissingPrerequisite, RemoteError
from clustertool.model import Cluster, Node
from clustertool.remote.transport import KEX_PREFERENCE, alias, leader_alias
from clustertool.state import ClusterPaths


def keygen_argv(path: Path, comment: str) -> list[str]:
    return ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]


def ensure_keypair(cluster_name: str) -> ClusterPaths:
    paths = ClusterPaths(cluster_name)
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    if not paths.key.exists():
        try:
            subprocess.run(keygen_argv(paths.key, f"clustertool-{cluster_name}"), check=True,
                           capture_output=True)
        except FileNotFoundError:
            raise MissingPrerequisite("ssh-keygen not found",
                                      hint="install the OpenSSH client (apt-get install openssh-client)") from None
    os.chmod(paths.key, 0o600)
    return paths


def keyscan_argv(host: str, port: int, timeout: int = 5) -> list[str]:
    return ["ssh-keyscan", "-T", str(timeout), "-t", "ed25519,ecdsa,rsa", "-p", str(port), host]


def keyscan(node: Node) -> list[str]:
    """Collect a node's host keys on first contact (trust on first use), "type base64" lines."""
    proc = subprocess.run(keyscan_argv(node.reach_host, node.ssh_port), capture_output=True, text=True)
    keys = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            keys.append(f"{parts[1]} {parts[2]}")
    if not keys:
        raise RemoteError(f"{node.name} ({node.reach_host}:{node.ssh_port}): no host key could be collected",
                          hint="is sshd running and the port reachable from here?")
    return keys


def pin_host_keys(cluster: Cluster) -> None:
    """Make sure every node has pinned host keys (collecting them once where unknown)."""
    for node in cluster.nodes:
        if not node.host_keys:
            node.host_keys = keyscan(node)


def local_known_hosts(cluster: Cluster) -> str:
    """known_hosts for this machine: keyed by the HostKeyAlias of each node."""
    lines = []
    for node in cluster.ordered_nodes():
        for key in node.host_keys:
            lines.append(f"{alias(cluster.name, node)} {key}")
    return "\n".join(lines) + "\n"


def _host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def node_known_hosts(cluster: Cluster) -> str:
    """known_hosts for the nodes themselves: private address, hostname and aliases."""
    lines = []
    for node in cluster.ordered_nodes():
        names = [_host_pattern(node.address, node.ssh_port), node.name, alias(cluster.name, node)]
        if node.is_leader:
            names.append(leader_alias(cluster.name))
        for key in node.host_keys:
            lines.append(f"{','.join(dict.fromkeys(names))} {key}")
    return "\n".join(lines) + "\n"


def write_local_known_hosts(cluster: Cluster) -> Path:
    paths = ClusterPaths(cluster.name)
    paths.known_hosts.write_text(local_known_hosts(cluster))
    return paths.known_hosts


def node_ssh_config_block(cluster: Cluster) -> str:
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


def _kex_probe() -> str:
    """Shell setting $ct_kex to the node's own ssh's fast key exchanges (see transport)."""
    prefs = " ".join(shlex.quote(k) for k in KEX_PREFERENCE)
    return ("ct_kex=; ct_have=$(ssh -Q kex 2>/dev/null); "
            f"for k in {prefs}; do printf '%s\\n' \"$ct_have\" | grep -qxF \"$k\" && ct_kex=${{ct_kex:+$ct_kex,}}$k; done; "
            "[ -n \"$ct_kex\" ] || ct_kex=curve25519-sha256@libssh.org")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _managed_block_edit(name: str, block: str | None) -> str:
    """Shell that replaces (or removes, block=None) our marked block at the top of ~/.ssh/config."""
    begin, end = f"# >>> clustertool {name} >>>", f"# <<< clustertool {name} <<<"
    new = "" if block is None else f"{begin}\n{block}{end}\n"
    return "\n".join([
        "touch ~/.ssh/config && chmod 600 ~/.ssh/config",
        f"awk -v b={shlex.quote(begin)} -v e={shlex.quote(end)} "
        "'$0==b{skip=1;next} $0==e{skip=0;next} !skip' ~/.ssh/config > ~/.ssh/config.ct.tmp",
        f"{{ printf %s {shlex.quote(_b64(new))} | base64 -d | sed \"s/@CT_KEX@/$ct_kex/\"; "
        "cat ~/.ssh/config.ct.tmp; } > ~/.ssh/config.ct.new",
        "mv ~/.ssh/config.ct.new ~/.ssh/config && rm -f ~/.ssh/config.ct.tmp",
    ])


def wire_script(cluster: Cluster, private_key: str, public_key: str, hostfile: str | None) -> str:
    """Shell program (for stdin) that gives a node the cluster key, host keys and config."""
    key_file = f"~/.ssh/clustertool-{cluster.name}"
    lines = [
        "set -e", "umask 077", "mkdir -p ~/.ssh && chmod 700 ~/.ssh",
        f"printf %s {shlex.quote(_b64(private_key))} | base64 -d > {key_file}",
        f"chmod 600 {key_file}",
        f"printf %s {shlex.quote(_b64(public_key))} | base64 -d > {key_file}.pub",
        f"printf %s {shlex.quote(_b64(node_known_hosts(cluster)))} | base64 -d > {key_file}.known_hosts",
        "touch ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys",
        f"grep -qxF {shlex.quote(public_key.strip())} ~/.ssh/authorized_keys || "
        f"printf '%s\\n' {shlex.quote(public_key.strip())} >> ~/.ssh/authorized_keys",
        _kex_probe(),
        _managed_block_edit(cluster.name, node_ssh_config_block(cluster)),
    ]
    if hostfile is not None:
        lines.append(f"umask 022; printf %s {shlex.quote(_b64(hostfile))} | base64 -d > ~/hostfile")
    return "\n".join(lines) + "\n"


def unwire_script(cluster: Cluster, public_key: str) -> str:
    """Undo wire_script on a machine we do not own (static/adopted): remove only our traces."""
    key_file = f"~/.ssh/clustertool-{cluster.name}"
    return "\n".join([
        "umask 077",
        f"rm -f {key_file} {key_file}.pub {key_file}.known_hosts",
        "if [ -f ~/.ssh/authorized_keys ]; then "
        f"grep -vxF {shlex.quote(public_key.strip())} ~/.ssh/authorized_keys > ~/.ssh/ak.ct.tmp; "
        "cat ~/.ssh/ak.ct.tmp > ~/.ssh/authorized_keys; rm -f ~/.ssh/ak.ct.tmp; fi",
        "[ -f ~/.ssh/config ] && { " + _managed_block_edit(cluster.name, None).replace("\n", "; ") + "; }",
        "true",
    ]) + "\n"
