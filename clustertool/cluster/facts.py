"""What a node has, learned in one SSH round: a shell program (nodeprogs/facts.sh) and its parser.

Shared core: `doctor` reads every fact; `plugin check` reads the GPU count (and so decides
between NCCL and the collnet_bench stand-in).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR, MPI_COMMS
from clustertool.nodeprogs import shell_script

STRAY_RE = "python.*|" + "|".join(MPI_COMMS)  # the command names doctor looks for


@dataclass
class Disk:
    path: str
    total_kb: int
    avail_kb: int
    mount: str

    @property
    def free_pct(self) -> float:
        return 100.0 * self.avail_kb / self.total_kb if self.total_kb else 0.0


@dataclass
class Proc:
    pid: int
    comm: str
    job: str | None
    args: str


@dataclass
class NodeFacts:
    node: str
    values: dict[str, str] = field(default_factory=dict)
    disks: list[Disk] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)


def facts_script(plugin_path: str, disk_paths: list[str]) -> str:
    """nodeprogs/facts.sh: ``key=value``, ``df PATH TOTAL AVAIL MOUNT`` and ``proc PID COMM JOB ARGS`` lines."""
    return shell_script("facts", args=disk_paths, PLUGIN=plugin_path, JOBS_DIR=JOBS_DIR, JOB_ENV=JOB_ENV,
                        STRAY_RE=STRAY_RE)


def gpu_count(facts: NodeFacts) -> int:
    """GPUs nvidia-smi lists on the node (0 without nvidia-smi, or when it fails)."""
    value = facts.values.get("gpus", "")
    return int(value) if value.isdigit() else 0


def parse_facts(node: str, text: str) -> NodeFacts:
    facts = NodeFacts(node)
    for line in text.splitlines():
        if line.startswith("df "):
            parts = line.split()
            if len(parts) >= 5 and parts[2].isdigit() and parts[3].isdigit():
                facts.disks.append(Disk(parts[1], int(parts[2]), int(parts[3]), parts[4]))
        elif line.startswith("proc "):
            parts = line.split(" ", 4)
            if len(parts) >= 4 and parts[1].isdigit():
                job = None if parts[3] == "-" else parts[3]
                facts.procs.append(Proc(int(parts[1]), parts[2], job, parts[4].strip() if len(parts) > 4 else ""))
        elif "=" in line:
            key, _, value = line.partition("=")
            facts.values[key.strip()] = value.strip()
    return facts
