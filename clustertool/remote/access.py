"""How this machine reaches each node: directly, through the leader, or through the user's bastion.

``--access all``: every node takes SSH from this machine at its own address (today's behaviour).
``--access leader``: only the leader does; members have no address this machine can reach and are
reached through the leader with ssh's ProxyJump (host keys pinned on both hops, one persistent
ControlMaster connection to the leader that every member connection rides on).
``--jump user@host[:port]``: the user's own bastion comes first (clusters in private subnets):
the leader (or, with ``--access all``, every node) is reached through it.

Pure functions over the cluster's recorded options: the ssh_config, inventory and Fabric follow them.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node

MODES = ("leader", "all")
JUMP_HINT = "--jump USER@HOST[:PORT], e.g. --jump ec2-user@bastion.example.com"
_JUMP = re.compile(r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
                   r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?$")


@dataclass(frozen=True)
class Jump:
    """The user's bastion: who, where."""

    user: str
    host: str
    port: int = 22

    def __str__(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")


def parse_jump(text: str) -> Jump:
    """``user@host[:port]`` (user defaults to the local user name); one line on bad input."""
    match = _JUMP.match(str(text).strip())
    port = int(match.group("port")) if match and match.group("port") else 22
    if not match or not 1 <= port <= 65535:
        raise UsageError(f"--jump {text!r}: expected USER@HOST[:PORT]", hint=JUMP_HINT)
    return Jump(match.group("user") or getpass.getuser(), match.group("host").strip("[]"), port)


def check_mode(value: str | None) -> str:
    if value not in MODES:
        raise UsageError(f"--access {value!r}: expected one of {', '.join(MODES)}")
    return value


def mode(cluster: ClusterRecord) -> str:
    """The cluster's access mode; states written before access modes existed are ``all``."""
    return cluster.options.get("access") or "all"


def jump(cluster: ClusterRecord) -> Jump | None:
    text = cluster.options.get("jump")
    return parse_jump(text) if text else None


def alias(cluster_name: str, node: Node) -> str:
    """The ssh alias of a node: ``<cluster>-node-K``."""
    return f"{cluster_name}-{node.name}"


def leader_alias(cluster_name: str) -> str:
    return f"{cluster_name}-leader"


def jump_alias(cluster_name: str) -> str:
    """The ssh alias of the user's bastion in the cluster's ssh_config."""
    return f"{cluster_name}-jump"


def behind_leader(cluster: ClusterRecord, node: Node) -> bool:
    """Whether this machine reaches ``node`` only through the leader."""
    return mode(cluster) == "leader" and not node.is_leader and len(cluster.nodes) > 1


def hop(cluster: ClusterRecord, node: Node) -> str | None:
    """The alias ``node``'s connection jumps through (its ProxyJump), or None for a direct one."""
    if behind_leader(cluster, node):
        return leader_alias(cluster.name)
    if jump(cluster) is not None:
        return jump_alias(cluster.name)
    return None


def host_name(cluster: ClusterRecord, node: Node) -> str:
    """The address ssh connects to: the private one behind a jump, else what this machine reaches."""
    return node.address if hop(cluster, node) else node.reach_host


def direct(cluster: ClusterRecord, nodes: list[Node]) -> list[Node]:
    """The nodes this machine connects to without any jump (keyscan, port waits)."""
    return [n for n in nodes if hop(cluster, n) is None]


def describe(cluster: ClusterRecord) -> str:
    """One line for `status` and the plan: who is reached how."""
    via = jump(cluster)
    if mode(cluster) == "leader":
        first = f"the leader through {via}" if via else "only the leader takes SSH from here"
        return f"leader ({first}; members through the leader with ProxyJump)"
    return f"all (every node through {via})" if via else "all (every node takes SSH from here)"


def jump_block(cluster: ClusterRecord, identities: list[str]) -> list[str]:
    """The Host block of the user's bastion (before the cluster's wildcard block: first value wins).

    Its host key is pinned in the cluster's known_hosts (from the user's own known_hosts at `up`);
    it takes the user's own keys and agent, not only the cluster key."""
    via = jump(cluster)
    if via is None:
        return []
    return [f"Host {jump_alias(cluster.name)}", f"  HostName {via.host}", f"  Port {via.port}",
            f"  User {via.user}", f"  HostKeyAlias {jump_alias(cluster.name)}", "  IdentitiesOnly no",
            *[f"  IdentityFile {ident}" for ident in identities]]
