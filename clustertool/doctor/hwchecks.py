"""Checks that read the nodes' hardware: GPU health (`gpu`) and EFA (`efa`).

Each runs one node program on the nodes at once (nodeprogs/gpu_health.sh, efa_health.sh), every
step on the node in a time box, and the whole round in one too, so a hung nvidia-smi or DCGM is
reported as such instead of holding doctor up. The readings become findings in doctor/gpu.py and
doctor/efa.py.
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import Node
from clustertool.doctor import efa, gpu
from clustertool.doctor.findings import CheckResult, Finding
from clustertool.doctor.smi import CSV_FIELDS
from clustertool.jobs import logs, records
from clustertool.nodeprogs import shell_script
from clustertool.remote.group import run_on_nodes

Expected = tuple[Optional[int], Optional[int], int]   # EFA interfaces attached at up, the type's, the peers'
_SINCE_RE = re.compile(r"^(\d+)\s*(s|sec|m|min|h|d|w)$")
_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\d(?:[ T]\d\d:\d\d(?::\d\d)?)?$")


def since_arg(text: str | None) -> str:
    """``--since`` as journalctl takes it: "2h" -> "-2h", "2026-11-26 10:00" as is, None -> "" (boot)."""
    if not text:
        return ""
    value = text.strip()
    if m := _SINCE_RE.match(value):
        return f"-{m.group(1)}{m.group(2)}"
    if _DATE_RE.match(value):
        return value.replace("T", " ")
    raise UsageError(f"--since {text!r}: give an age (30m, 2h, 3d) or a time (2026-11-26 10:00)")


def gpu_options(deep: int | bool, since: str | None, box: float, deep_box: float) -> gpu.Options:
    """The gpu check's options from doctor's arguments (``deep=True`` is level 2), checked."""
    level = 2 if deep is True else int(deep)
    if level not in (0, 1, 2, 3, 4):
        raise UsageError(f"--deep-level {level}: DCGM's diagnostic levels are 1 (seconds), 2 (about two "
                         "minutes), 3 and 4 (long)")
    if box <= 0 or deep_box <= 0:
        raise UsageError("--gpu-timeout and --deep-timeout are seconds above 0")
    return gpu.Options(box=box, deep=level, deep_box=deep_box, since=since_arg(since))


def instance_type(node: Node) -> str:
    return str(node.extra.get("instance_type") or "")


def gpu_script(options: gpu.Options) -> str:
    return shell_script("gpu_health", MARK=gpu.MARK, BOX=_seconds(options.box), SINCE=options.since,
                        CSV_FIELDS=CSV_FIELDS, DEEP=int(options.deep), DEEP_BOX=_seconds(options.deep_box))


def _seconds(box: float) -> int:
    """Whole seconds for timeout(1), at least 1 (its 0 means no limit)."""
    return max(1, math.ceil(box))


def gpu_check(session: ClusterSession, nodes: list[Node], options: gpu.Options, busy: set[str]) -> CheckResult:
    """``busy``: running jobs; DCGM's diagnostics load the GPUs, so --deep waits for an idle cluster."""
    workers = [n for n in nodes if not n.is_server]
    findings: list[Finding] = []
    if options.deep and busy:
        findings.append(Finding("gpu", None, "info", f"--deep skipped: job {sorted(busy)[0]} is running "
                                "(DCGM's diagnostics would load its GPUs)", fix="run doctor --deep between jobs"))
        options = gpu.Options(options.box, 0, options.deep_box, options.since)
    # the node's own boxes (each step, at most 4 nvidia-smi/kernel-log steps, then DCGM), plus SSH
    limit = 4 * (options.box + 3) + (options.deep_box + 3 if options.deep else 0) + 30
    result = run_on_nodes(session, workers, "sh -s", timeout=limit, stdin_data=gpu_script(options).encode())
    per_node, no_gpu = {}, []
    for node, r in zip(workers, result.results):
        if r.error or r.exit_code != 0:
            findings.append(Finding("gpu", node.name, "warning", f"GPU check could not run: {r.reason}",
                                    fix=f"`clustertool reboot --nodes {node.name}` if it does not answer"))
            continue
        steps = gpu.sections(r.stdout)
        if "none" in steps:
            no_gpu.append(node.name)
            continue
        found, per_node[node.name] = gpu.node_findings(node.name, steps, slots=node.slots,
                                                       instance_type=instance_type(node), options=options)
        findings += found
    if workers and len(no_gpu) == len(workers):
        return CheckResult("gpu", skipped="no GPU")
    return CheckResult("gpu", findings, data={"nodes": per_node, "no_nvidia_smi": no_gpu,
                                              "deep_level": options.deep, "since": options.since or "boot"})


def efa_check(session: ClusterSession, nodes: list[Node], *, box: float = 30.0,
              nccl_log: str | None = None) -> CheckResult:
    """fi_info and the kernel's EFA devices on every node against what it should have; then, where
    a node should have EFA, the NCCL log (``nccl_log``: a file here or a job; default the newest
    `plugin check` job) read for the network NCCL used."""
    script = shell_script("efa_health", MARK=efa.MARK, BOX=_seconds(box))
    result = run_on_nodes(session, nodes, "sh -s", timeout=box + 30, stdin_data=script.encode())
    findings: list[Finding] = []
    seen: dict[str, efa.NodeEfa] = {}
    for node, r in zip(nodes, result.results):
        if r.error or r.exit_code != 0:
            findings.append(Finding("efa", node.name, "warning", f"EFA check could not run: {r.reason}"))
        else:
            seen[node.name] = efa.parse_node(r.stdout)
    wants: dict[str, int] = {}
    for node, (attached, type_count, peers) in _expectations(nodes, seen):
        wants[node.name] = attached if attached is not None else (type_count or max(peers, _shown(seen[node.name])))
        findings += efa.node_findings(node.name, seen[node.name], attached=attached, type_count=type_count,
                                      instance_type=instance_type(node), box=box, peers=peers)
    if not wants:
        return CheckResult("efa", skipped="no EFA interfaces")
    findings += _nccl(session, nccl_log, seen, wants)
    data = {"nodes": {n: {"host": e.host, "sysfs": e.sysfs, "fi_info": e.fi_devices, "fi_info_rc": e.fi_rc,
                          "aws_ofi_nccl": e.ofi_nccl, "expected": wants.get(n)} for n, e in seen.items()}}
    return CheckResult("efa", findings, data=data)


def _shown(e: efa.NodeEfa) -> int:
    return max(len(e.sysfs), len(e.fi_devices))


def _expectations(nodes: list[Node], seen: dict[str, efa.NodeEfa]) -> list[tuple[Node, Expected]]:
    """Each node that should have EFA, with (interfaces `up` attached, the type's count, the most its
    peers show: workers against workers, servers against servers)."""
    out = []
    for node in (n for n in nodes if n.name in seen):
        attached, type_count = efa.expected_efa(node.extra, instance_type(node))
        alike = [n.name for n in nodes if n.is_server == node.is_server and n.name != node.name and n.name in seen]
        peers = max((_shown(seen[n]) for n in alike), default=0)
        if attached or type_count or peers or _shown(seen[node.name]):
            out.append((node, (attached, type_count, peers)))
    return out


def _nccl(session: ClusterSession, ref: str | None, seen: dict[str, efa.NodeEfa],
          wants: dict[str, int]) -> list[Finding]:
    try:
        loaded = nccl_log_text(session, ref)
    except ToolError as exc:
        return [Finding("efa", None, "warning", f"the NCCL log could not be read: {exc.message}", fix=exc.hint or "")]
    if loaded is None:
        return [Finding("efa", None, "info", "no NCCL log read: NCCL's choice of network is not checked",
                        fix="run `clustertool plugin check`, or give --nccl-log JOB (a job run with "
                            "-x NCCL_DEBUG=INFO)")]
    text, source = loaded
    uses = efa.nccl_net_use(text)
    if not uses:
        return [Finding("efa", None, "warning", f"{source} holds no NCCL INFO lines about the network",
                        fix="run the job with -x NCCL_DEBUG=INFO (plugin check does)")]
    node_of = {e.host.split(".")[0]: n for n, e in seen.items() if e.host}
    expected = {h: wants.get(n, 0) for h, n in node_of.items()}
    expected[""] = max(wants.values())
    return efa.nccl_findings(uses, expected, source, node_of)


def nccl_log_text(session: ClusterSession, ref: str | None) -> tuple[str, str] | None:
    """(the NCCL lines of the log, where it came from): a file on this machine, a job (id or name), or
    the newest `plugin check` job; None when there is none."""
    if ref and os.path.isfile(ref):
        with open(ref, errors="replace") as fh:
            return "".join(line for line in fh if "NCCL" in line), ref
    jobs = records.load_all(session.record.name)
    if ref is None:
        if not any(j.name == "plugin-check" for j in jobs):
            return None
        ref = "plugin-check"
    job = records.resolve(jobs, ref)
    lines: list[str] = []
    logs.job_lines(session, job, lambda line: lines.append(line) if "NCCL" in line else None)
    return "\n".join(lines), f"job {job.id}" + (f" ({job.name})" if job.name else "")
