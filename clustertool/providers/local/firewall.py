"""``--access leader`` on the local provider: members take SSH only from the cluster's own nodes.

This models the AWS security group of a cluster behind its leader: in each member's network
namespace an nftables table rejects TCP/22 from every source but the cluster's node addresses, so
this machine (the bridge address, or any other it could send from) gets a refused connection and
reaches a member only by jumping through the leader.  The rules live in the member's namespace:
they go when the namespace goes (down), and stay across stop/start, like a security group.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clustertool.core.errors import ProviderError
from clustertool.core.model import LEADER, ClusterRecord, Node
from clustertool.providers.local import net, sysops

TABLE = "clustertool_access"


def nft_argv(netns: str) -> list[str]:
    """``nft -f -`` inside a node's namespace (the ruleset on stdin)."""
    return ["ip", "netns", "exec", netns, "nft", "-f", "-"]


def member_ruleset(node_addresses: list[str], port: int = 22) -> str:
    """A member's input filter: SSH from the cluster's nodes only; everyone else is refused (RST)."""
    allowed = ", ".join(node_addresses)
    return "\n".join([
        f"table inet {TABLE} {{",
        "  chain input {",
        "    type filter hook input priority filter; policy accept;",
        f"    tcp dport {port} ip saddr != {{ {allowed} }} reject with tcp reset",
        f"    tcp dport {port} meta nfproto ipv6 reject with tcp reset",
        "  }",
        "}",
    ]) + "\n"


PROBE = """
import socket, sys, time
port, deadline, pending = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), set(sys.argv[3:])
while pending and time.monotonic() < deadline:
    for addr in sorted(pending):
        try:
            socket.create_connection((addr, port), timeout=0.2).close()
            pending.discard(addr)
        except OSError:
            pass
    time.sleep(0.02) if pending else None
print(" ".join(sorted(pending)))
sys.exit(1 if pending else 0)
"""


def probe_argv(netns: str, python: str, addresses: list[str], timeout: float, port: int = 22) -> list[str]:
    """Wait, from inside ``netns`` (the leader's), until every address accepts TCP on ``port``;
    prints the addresses that never did."""
    return ["ip", "netns", "exec", netns, python, "-c", PROBE, str(port), f"{timeout:g}", *addresses]


def wait_from(netns: str, python: str, addresses: list[str], timeout: float) -> list[str]:
    """The addresses that did not accept SSH from ``netns`` within ``timeout`` seconds."""
    if not addresses:
        return []
    proc = subprocess.run(probe_argv(netns, python, addresses, timeout), capture_output=True, text=True,
                          timeout=timeout + 30)
    return proc.stdout.split() if proc.returncode else []


def wait_members(cluster: ClusterRecord, members: list[Node], timeout: float) -> None:
    """Members that take no SSH from here: waited for from inside the leader's namespace."""
    if not members:
        return
    leader = next(n for n in cluster.nodes if n.role == LEADER)
    missing = wait_from(net.netns_name(cluster.name, leader.index), sys.executable,
                        [n.address for n in members], timeout)
    if missing:
        node = next(n for n in members if n.address == missing[0])
        log = Path(cluster.provider_state["nodes_dir"]) / node.name / "node.log"
        raise ProviderError(f"{node.name} ({node.address}:22) did not accept SSH from the leader within "
                            f"{timeout:.0f}s", hint=f"its log {log} ends: {sysops.log_tail(log)}")
