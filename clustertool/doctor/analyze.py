"""Pure analyzers: node facts (and measurements) in, findings out."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import AbstractSet, Iterable

from clustertool.bench.allreduce import size_text
from clustertool.cluster.facts import Disk, NodeFacts
from clustertool.doctor.findings import Finding
from clustertool.doctor.plugin_check_report import CheckReport

DISK_ERROR_PCT, DISK_ERROR_KB = 5.0, 512 * 1024
DISK_WARN_PCT, DISK_WARN_KB = 15.0, 5 * 1024 * 1024
SKEW_ERROR_S, SKEW_WARN_S = 1.0, 0.25

SAME_KEYS = {  # key -> (label, severity when it differs)
    "nproc": ("CPU count", "warning"),
    "gpus": ("GPU count", "error"),
    "driver": ("NVIDIA driver version", "error"),
    "cuda": ("CUDA version", "error"),
    "nccl": ("NCCL version", "error"),
    "mpi": ("MPI version", "error"),
    "plugin": ("NCCL plugin checksum", "error"),
    "instance_type": ("instance type", "warning"),
    "az": ("availability zone", "error"),
}


def _gib(kb: int) -> str:
    return f"{kb / 1024 / 1024:.1f} GiB" if kb >= 1024 * 1024 else f"{kb / 1024:.0f} MiB"


def disk_findings(facts: Iterable[NodeFacts]) -> list[Finding]:
    out = []
    for f in facts:
        seen: dict[str, list[Disk]] = {}
        for d in f.disks:
            seen.setdefault(d.mount, []).append(d)
        for mount, disks in seen.items():
            d = disks[0]
            paths = ", ".join(x.path for x in disks)
            if d.free_pct < DISK_ERROR_PCT or d.avail_kb < DISK_ERROR_KB:
                severity = "error"
            elif d.free_pct < DISK_WARN_PCT or d.avail_kb < DISK_WARN_KB:
                severity = "warning"
            else:
                continue
            out.append(Finding(
                "disk", f.node, severity,
                f"{paths}: {_gib(d.avail_kb)} free of {_gib(d.total_kb)} ({d.free_pct:.0f}%) on {mount}",
                fix="free space there; `clustertool clean --logs` removes finished jobs' logs "
                    "(`doctor --fix` does that on this node)",
                fixable=True, data={"mount": mount, "avail_kb": d.avail_kb, "total_kb": d.total_kb}))
    return out


ROLE_KEYS = ("nproc", "gpus", "driver", "cuda", "nccl", "instance_type")  # compared within workers, within servers


def sameness_findings(facts: list[NodeFacts], slots: dict[str, int],
                      servers: AbstractSet[str] = frozenset()) -> list[Finding]:
    """Findings for nodes that differ from the others. Reduction servers (``servers``) are CPU
    machines: their hardware is compared among themselves; the plugin, MPI and AZ with every node."""
    out = []
    for key, (label, severity) in SAME_KEYS.items():
        values = {f.node: f.values[key] for f in facts if key in f.values}
        groups = ([{n: v for n, v in values.items() if (n in servers) == side} for side in (False, True)]
                  if key in ROLE_KEYS else [values])
        for group in groups:
            out += _differing(group, key, label, severity, "servers" if set(group) <= servers and servers else "nodes")
    for f in facts:
        gpus = f.values.get("gpus", "none")
        if f.node in servers:
            continue
        if gpus.isdigit() and f.node in slots and int(gpus) != slots[f.node]:
            out.append(Finding("sameness", f.node, "warning",
                               f"{gpus} GPU(s) but {slots[f.node]} slot(s) in the hostfile",
                               fix="bring the cluster up with --slots matching the GPUs (or none: slots = GPUs)"))
    return out


def _differing(values: dict[str, str], key: str, label: str, severity: str, others: str) -> list[Finding]:
    if len(set(values.values())) <= 1:
        return []
    common, _ = Counter(values.values()).most_common(1)[0]
    return [Finding("sameness", node, severity,
                    f"{label} is {value or 'empty'!s} here, {common or 'empty'} on the other {others}",
                    fix=("redeploy the plugin to every node (`clustertool plugin deploy`)" if key == "plugin"
                         else f"make {label} the same on every node (same AMI/image, same packages)"),
                    data={"key": key, "value": value, "common": common})
            for node, value in values.items() if value != common]


def stray_findings(facts: Iterable[NodeFacts], running_jobs: set[str]) -> list[Finding]:
    out = []
    for f in facts:
        strays = [p for p in f.procs if p.job is None or p.job not in running_jobs]
        if not strays:
            continue
        listing = "; ".join(f"{p.pid} {p.comm}" + (f" (job {p.job}, ended)" if p.job else "")
                            + (f": {p.args[:60]}" if p.args else "") for p in strays[:5])
        more = f" and {len(strays) - 5} more" if len(strays) > 5 else ""
        out.append(Finding("strays", f.node, "warning",
                           f"{len(strays)} python/MPI process(es) outside any running job: {listing}{more}",
                           fix="`doctor --fix` kills them (kill -9 by pid); `clustertool kill --all-python` is blunter",
                           fixable=True, data={"pids": [p.pid for p in strays],
                                               "comms": {str(p.pid): p.comm for p in strays}}))
    return out


def clock_findings(offsets: dict[str, float], uncertainty: dict[str, float]) -> list[Finding]:
    """``offsets``: node clock minus this machine's; compared against the nodes' median."""
    if len(offsets) < 2:
        return []
    middle = statistics.median(offsets.values())
    out = []
    for node, off in offsets.items():
        skew = off - middle
        slack = uncertainty.get(node, 0.0)
        if abs(skew) - slack > SKEW_ERROR_S:
            severity = "error"
        elif abs(skew) - slack > SKEW_WARN_S:
            severity = "warning"
        else:
            continue
        out.append(Finding("clock", node, severity, f"clock is {skew:+.2f}s off the other nodes",
                           fix="run chrony/systemd-timesyncd on every node (AWS: the Amazon Time Sync Service)",
                           data={"skew_s": skew}))
    return out


def nccl_findings(report: CheckReport) -> list[Finding]:
    """`plugin check`'s report as findings: one line of what NCCL did, then each problem and its fix."""
    out = []
    n = report.nccl
    if n is not None:
        choices = ", ".join(f"{size_text(r.size)} {r.algo}/{r.proto}" for r in report.rows)
        out.append(Finding("plugin-nccl", None, "info",
                           f"NCCL {n.version or '?'} on {n.network or '?'}"
                           + (f" (plugin ABI v{n.net_abi})" if n.plugin_loaded and n.net_abi else "")
                           + f"; CollNet {'on' if n.collnet_on else 'off'}"
                           + (f"; allreduce {choices}" if choices else "") + f"; #wrong {report.wrong}",
                           data={"rows": [vars(r) for r in report.rows]}))
    out += [Finding("plugin-nccl", None, p.severity, p.message, fix=p.fix) for p in report.problems]
    return out
