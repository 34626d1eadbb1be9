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
"""

from __future__ import annotations

import shlex

from clustertool.model import Node

FULL_MESH_MAX = 16
SAMPLE_OFFSETS = (1, 2, 4, 8)


def mesh_peers(nodes: list[Node]) -> dict[str, list[Node]]:
    """Which peers each node tries: all others up to FULL_MESH_MAX nodes, else the ring sample."""
    ordered = sorted(nodes, key=lambda n: n.index)
    n = len(ordered)
    if n <= FULL_MESH_MAX:
        return {a.name: [b for b in ordered if b.name != a.name] for a in ordered}
    return {a.name: [ordered[(i + k) % n] for k in SAMPLE_OFFSETS] for i, a in enumerate(ordered)}


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
