"""Can a node reach others the way mpirun will (plain ssh by private address, no prompt)?"""

from __future__ import annotations

import shlex

from clustertool.model import Node


def mesh_script(targets: list[Node]) -> str:
    """Each target by private address, in parallel, as mpirun's ssh would: ``fail ADDR reason``."""
    lines = []
    for n in targets:
        addr = shlex.quote(n.address)
        lines.append(f"( out=$(ssh -o ConnectTimeout=5 -o BatchMode=yes {addr} true 2>&1) || "
                     f"echo \"fail {n.address} $(echo $out | tail -c 160)\" ) &")
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
