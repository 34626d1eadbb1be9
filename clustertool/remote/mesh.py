"""Can a node reach others the way mpirun will (plain ssh by private address, no prompt)?

Checked from the nodes themselves, each trying its peers in parallel (a pair that fails is
tried once more, alone, before it counts: a busy machine's slow handshake is not a fault).
Every node to every node is n(n-1) handshakes: up to FULL_MESH_MAX nodes that is what runs.  Beyond it each node
tries SAMPLE_OFFSETS peers along the ring (i+1, i+2, i+4, i+8), so each node is tried by
four others and tries four: a node whose sshd, host key or cluster key is wrong shows up
from four sides (which tells a bad target from a bad source), and any split of the cluster
into parts that cannot reach each other crosses some tried pair (the i+1 ring alone spans
every node).  What a sample can miss is a fault between two particular nodes only; on a
real cluster those come from per-pair firewalls, which one security group rules out.

The leader's own check after `up` (it must reach every node, as mpirun does) is every node by
real ssh up to LEADER_FULL_MAX nodes.  Beyond it, a real ssh only to a sample (the nodes at
offsets 1, 2, 4, 8 ... along the ring, and the last), and to every node an SSH banner check from
the leader (``leader_targets``): the leader's key, config and known_hosts are the same files for
every target, and each node has already accepted the cluster key and shown its pinned host key
to this machine while it was wired, so what is left to check per node is the path from the
leader to its sshd.  A full ssh per node costs a handshake on both ends; a banner, a connection.
"""

from __future__ import annotations

import shlex

from clustertool.core.model import Node

FULL_MESH_MAX = 16
SAMPLE_OFFSETS = (1, 2, 4, 8)
LEADER_FULL_MAX = 32


def mesh_peers(nodes: list[Node]) -> dict[str, list[Node]]:
    """Which peers each node tries: all others up to FULL_MESH_MAX nodes, else the ring sample."""
    ordered = sorted(nodes, key=lambda n: n.index)
    n = len(ordered)
    if n <= FULL_MESH_MAX:
        return {a.name: [b for b in ordered if b.name != a.name] for a in ordered}
    return {a.name: [ordered[(i + k) % n] for k in SAMPLE_OFFSETS] for i, a in enumerate(ordered)}


def leader_targets(nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    """(nodes the leader reaches by real ssh, nodes it checks by their SSH banner): every node by
    ssh up to LEADER_FULL_MAX nodes; beyond it a sample of O(log n) by ssh, the rest by banner."""
    ordered = sorted(nodes, key=lambda n: n.index)
    n = len(ordered)
    if n <= LEADER_FULL_MAX:
        return ordered, []
    picks = {n - 1}
    step = 1
    while step < n:
        picks.add(step)
        step *= 2
    sample = [ordered[i] for i in sorted(picks)]
    chosen = {node.name for node in sample}
    return sample, [node for node in ordered if node.name not in chosen]


def mesh_script(targets: list[Node], parallel: bool = True) -> str:
    """Each target by private address, as mpirun's ssh would: ``fail ADDR reason`` lines.

    In parallel, or one after another (``parallel=False``: the second try of failed pairs)."""
    lines = []
    for n in targets:
        addr = shlex.quote(n.address)
        lines.append(f"( out=$(ssh -o ConnectTimeout=10 -o BatchMode=yes {addr} true 2>&1) || "
                     f"echo \"fail {n.address} $(echo $out | tail -c 160)\" )" + (" &" if parallel else ""))
    return "\n".join(lines + ["wait", "true"]) + "\n"


def failed_targets(output: str) -> dict[str, str]:
    """{address: reason} from a mesh_script's output."""
    failed = {}
    for line in output.splitlines():
        if line.startswith("fail "):
            parts = line.split(" ", 2)
            failed[parts[1]] = parts[2].strip() if len(parts) > 2 else "failed"
    return failed


def port_wait_script(targets: list[Node], timeout: int = 120) -> str:
    """On the leader: wait until every target's SSH port accepts (members this machine cannot reach
    itself come up behind the leader); ``fail ADDR reason`` for those that never did."""
    lines = []
    for n in targets:
        addr, port = shlex.quote(n.address), int(n.ssh_port)
        lines.append(f"( i=0; until timeout 3 bash -c 'exec 3<>/dev/tcp/'{addr}'/{port}' 2>/dev/null; do "
                     f"i=$((i+1)); [ $i -ge {max(1, timeout // 2)} ] && "
                     f"{{ echo \"fail {n.address} port {port} not answering after {timeout}s\"; exit 0; }}; "
                     "sleep 2; done ) &")
    return "\n".join(lines + ["wait", "true"]) + "\n"
