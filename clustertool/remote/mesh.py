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
