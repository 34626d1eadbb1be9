"""What doctor learns from each node in one SSH round: a shell program and its parser."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from clustertool.jobs.mpirun import JOB_ENV, JOBS_DIR
from clustertool.jobs.scripts import MPI_COMMS

STRAY_PATTERN = "python*|" + "|".join(MPI_COMMS)


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
    """POSIX sh printing ``key=value``, ``df PATH TOTAL AVAIL MOUNT`` and ``proc PID COMM JOB ARGS`` lines."""
    plugin = shlex.quote(plugin_path)
    paths = " ".join(['"$HOME"', f'"$HOME/{JOBS_DIR}"'] + [shlex.quote(p) for p in disk_paths])
    return "\n".join([
        'echo "nproc=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"',
        "if command -v nvidia-smi >/dev/null 2>&1; then",
        '  echo "gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)"',
        '  echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"',
        "  echo \"cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p' | head -1)\"",
        "else echo 'gpus=none'; fi",
        'echo "mpi=$(mpirun --version 2>/dev/null | head -1)"',
        "n=$(ldconfig -p 2>/dev/null | awk '/libnccl\\.so/ {print $NF; exit}')",
        'echo "nccl=$( [ -n "$n" ] && basename "$(readlink -f "$n")" || echo none)"',
        f'if [ -f {plugin} ]; then echo "plugin=$(sha256sum {plugin} | cut -c1-64)"; else echo "plugin=absent"; fi',
        'echo "iperf3=$(command -v iperf3 >/dev/null 2>&1 && echo yes || echo no)"',
        f"for p in {paths}; do [ -d \"$p\" ] && df -Pk \"$p\" 2>/dev/null | "
        "awk -v p=\"$p\" 'NR==2 {print \"df\", p, $2, $4, $6}'; done",
        "jobof() {",
        f"  j=$(grep -a -z -o '^{JOB_ENV}=[a-z0-9-]*' /proc/$1/environ 2>/dev/null | tr -d '\\0' | cut -d= -f2)",
        '  if [ -z "$j" ]; then for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do',
        f"    j=$(grep -a -z -o '^{JOB_ENV}=[a-z0-9-]*' /proc/$c/environ 2>/dev/null | tr -d '\\0' | cut -d= -f2)",
        '    [ -n "$j" ] && break; done; fi',
        '  echo "${j:--}"',
        "}",
        "ps -e -o pid=,comm= | while read -r pid comm; do",
        f'  case "$comm" in {STRAY_PATTERN})',
        "    [ \"$pid\" = \"$$\" ] && continue",
        "    echo \"proc $pid $comm $(jobof $pid) $(tr '\\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-120)\";;",
        "  esac",
        "done",
        "true",
    ]) + "\n"


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
