"""`doctor --check gpu`: one node's GPU health, from what nodeprogs/gpu_health.sh printed.

Pure functions (stdlib only at import time, so a bare GPU machine with Python can import this and
read its own nvidia-smi): the node program's sections, DCGM's diag JSON, and the findings, each
with a severity, the measured value and a fix. nvidia-smi's formats: doctor/smi.py; the Xid
catalogue and kernel-log lines: doctor/xid.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from clustertool.doctor import xid
from clustertool.doctor.findings import Finding
from clustertool.doctor.smi import Gpu, SmiError, parse_apps, parse_csv, parse_xml

MARK = "@@ct-gpu"            # the node program's section marker: "@@ct-gpu NAME rc=RC [words]"
TIMED_OUT = (124, 137)       # timeout(1): stopped with TERM, or KILL after the grace

# GPUs per AWS instance type (EC2 accelerated computing instance types; describe_instance_types'
# GpuInfo says the same). Sizes not listed here are compared with the hostfile's slots only.
EXPECTED_GPUS = {
    "p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8, "p4de.24xlarge": 8,
    "p5.48xlarge": 8, "p5e.48xlarge": 8, "p5en.48xlarge": 8,
    **{f"{family}.{size}": 1 for family in ("g5", "g6", "g6e")
       for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    **{f"{family}.{size}": n for family in ("g5", "g6", "g6e")
       for size, n in (("12xlarge", 4), ("24xlarge", 4), ("48xlarge", 8))},
    **{f"g4dn.{size}": 1 for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g4dn.12xlarge": 4, "g4dn.metal": 8,
}

BUSY_UTIL = 5                # % utilization from which a GPU counts as busy (for the PCIe generation)
STRAY_MEMORY_MIB = 1024      # memory in use with no process, above this, is worth a warning
HW_REASONS = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
              "hw_power_brake_slowdown": "HW power brake slowdown"}


@dataclass
class Step:
    rc: int
    text: str
    words: str = ""          # what the marker line adds after rc= (e.g. the kernel log's source)

    @property
    def timed_out(self) -> bool:
        return self.rc in TIMED_OUT


@dataclass
class Options:
    box: float = 60.0        # seconds each nvidia-smi / kernel-log step may take on the node
    deep: int = 0            # 0: no DCGM; 1 or 2: `dcgmi diag -r N`
    deep_box: float = 600.0
    since: str = ""          # the kernel-log window ("" = since boot)


def sections(text: str) -> dict[str, Step]:
    """The node program's output, by step name."""
    out: dict[str, Step] = {}
    name: str | None = None
    lines: list[str] = []
    rc, words = 0, ""
    for line in text.splitlines():
        m = re.match(rf"^{MARK} (\S+) rc=(-?\d+) ?(.*)$", line)
        if m:
            if name is not None:
                out[name] = Step(rc, "\n".join(lines), words)
            name, rc, words, lines = m.group(1), int(m.group(2)), m.group(3), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        out[name] = Step(rc, "\n".join(lines), words)
    return out


# ---- DCGM ----------------------------------------------------------------------------------

@dataclass
class DcgmResult:
    category: str
    test: str
    gpu: int | None
    status: str              # Fail | Warn
    messages: list[str] = field(default_factory=list)
    error_category: int | None = None


def parse_dcgm(text: str) -> tuple[list[DcgmResult], str]:
    """``dcgmi diag -r N -j``: (the failed or warned tests per GPU, DCGM's runtime error if any).

    DCGM 4 (dcgmi/Diag.cpp, v4.x) writes {"DCGM Diagnostic": {"test_categories": [{"category",
    "tests": [{"name", "results": [{"entity_group": "GPU", "entity_id", "status", "warnings":
    [{"warning", "error_id", "error_category", "error_severity"}]}], "test_summary"}]}]}};
    DCGM 3 the same under "DCGM GPU Diagnostic" with "gpu_id" (a string) in each result."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ValueError(f"dcgmi printed no JSON: {text.strip().splitlines()[0][:160] if text.strip() else 'nothing'}")
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") or {}
    out = []
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            for result in test.get("results") or []:
                status = str(result.get("status", ""))
                if status not in ("Fail", "Warn"):
                    continue
                warnings = result.get("warnings") or []
                gpu = result.get("entity_id") if result.get("entity_group", "GPU") == "GPU" else None
                gpu = gpu if gpu is not None else result.get("gpu_id")
                out.append(DcgmResult(
                    str(category.get("category", "")), str(test.get("name", "")),
                    int(gpu) if str(gpu).isdigit() else None, status,
                    [str(w.get("warning") or w.get("warnings") or "") for w in warnings if isinstance(w, dict)],
                    next((w.get("error_category") for w in warnings if isinstance(w, dict)), None)))
    return out, str(root.get("runtime_error") or "")


# ---- fixes ---------------------------------------------------------------------------------

def fix_for(action: str, node: str, gpu: int | None, then: str = "") -> str:
    reset = (f"reset GPU {gpu} while no job uses it (`clustertool exec -n {node} -- sudo nvidia-smi -r -i {gpu}`) "
             f"or `clustertool reboot --nodes {node}`" if gpu is not None else f"`clustertool reboot --nodes {node}`")
    text = {xid.RESTART_APP: "restart the job; if it recurs on this node only: " + reset,
            xid.RESET_GPU: reset,
            xid.REBOOT: f"`clustertool reboot --nodes {node}`",
            xid.REPLACE: replace_fix(node)}[action]
    return text + (f"; {then}: {replace_fix(node)}" if then else "")


def replace_fix(node: str) -> str:
    return (f"`clustertool cordon {node}`, then replace the instance (on AWS a stop and start moves it to "
            f"other hardware)")


# ---- findings ------------------------------------------------------------------------------

def _f(node: str, severity: str, message: str, fix: str, **data: Any) -> Finding:
    return Finding("gpu", node, severity, message, fix=fix, data=data)


def node_findings(node: str, steps: dict[str, Step], *, slots: int, instance_type: str = "",
                  options: Options | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Findings for one node with nvidia-smi, and the data that backs them (GPUs, Xids, DCGM)."""
    opt = options or Options()
    out: list[Finding] = []
    gpus, source = _gpus(node, steps, opt, out)
    apps = parse_apps(steps["smi-apps"].text) if "smi-apps" in steps and steps["smi-apps"].rc == 0 else {}
    for gpu in gpus:
        gpu.pids = sorted(set(gpu.pids) | set(apps.get(gpu.uuid, [])))
    if gpus or source:
        out += count_findings(node, len(gpus), slots, instance_type)
    for gpu in gpus:
        out += gpu_findings(node, gpu)
    events = _xids(node, steps, opt, out)
    out += xid_findings(node, events, gpus)
    out += _dcgm(node, steps, opt)
    data = {"source": source, "gpus": [{"index": g.index, "bus_id": g.bus_id, "name": g.name, "util": g.util,
                                        "pcie": f"gen{g.gen}/{g.gen_max} x{g.width}/{g.width_max}",
                                        "ecc": g.ecc, "pids": g.pids} for g in gpus],
            "xids": [vars(e) for e in events], "kernel_log": steps.get("xid", Step(0, "")).words}
    return out, data


def _gpus(node: str, steps: dict[str, Step], opt: Options, out: list[Finding]) -> tuple[list[Gpu], str]:
    xml, csv_step = steps.get("smi-xml"), steps.get("smi-csv")
    if xml is not None and xml.timed_out:
        out.append(_f(node, "error", f"nvidia-smi -q -x did not answer within {opt.box:.0f} s (stopped)",
                      f"a GPU or the driver hangs: `clustertool reboot --nodes {node}`; if it stays: "
                      + replace_fix(node), step="smi-xml", timed_out=True))
        return [], ""
    for step, parse, what in ((xml, parse_xml, "nvidia-smi -q -x"), (csv_step, parse_csv, "nvidia-smi --query-gpu")):
        if step is None:
            continue
        try:
            return parse(step.text), what
        except SmiError as exc:
            if step is xml and csv_step is not None:
                continue
            out.append(_f(node, "error", f"{what} failed (exit {step.rc}): {exc}",
                          f"the driver does not answer: `clustertool reboot --nodes {node}`; if it stays: "
                          + replace_fix(node), step=what))
    return [], ""


def count_findings(node: str, found: int, slots: int, instance_type: str) -> list[Finding]:
    out = []
    expected = EXPECTED_GPUS.get(instance_type)
    if expected is not None and found < expected:
        out.append(_f(node, "error", f"{found} GPU(s) visible, a {instance_type} has {expected}",
                      f"a GPU fell off the bus or failed to start: `clustertool reboot --nodes {node}`; "
                      f"if it stays missing: {replace_fix(node)}", found=found, expected=expected))
    elif slots > found:
        out.append(_f(node, "error", f"{found} GPU(s) visible but {slots} slot(s) in the hostfile: ranks would "
                                     "share GPUs or fail to start",
                      f"`clustertool reboot --nodes {node}` if a GPU is missing; else bring the cluster up with "
                      "--slots matching the GPUs", found=found, slots=slots))
    return out


def gpu_findings(node: str, g: Gpu) -> list[Finding]:
    """One GPU's state: ECC, row remapping, clocks-event reasons, PCIe link, persistence, memory."""
    name = f"GPU {g.index} ({g.bus_id})"
    out = []
    vol_unc, agg_unc = g.ecc_count("volatile", "uncorrected"), g.ecc_count("aggregate", "uncorrected")
    if vol_unc:
        split = ", ".join(f"{m.upper()} {g.ecc[k]}" for m in ("dram", "sram")
                          if g.ecc.get(k := f"volatile.{m}.uncorrected"))
        out.append(_f(node, "error", f"{name}: {vol_unc} uncorrectable ECC error(s) since the driver loaded"
                                     + (f" ({split})" if split else ""),
                      fix_for(xid.RESET_GPU, node, g.index, "if they come back"),
                      gpu=g.index, volatile_uncorrected=vol_unc, aggregate_uncorrected=agg_unc))
    if g.flags.get("sram_threshold_exceeded") or g.flags.get("unrepairable_memory"):
        what = "SRAM error threshold exceeded" if g.flags.get("sram_threshold_exceeded") else "unrepairable memory"
        out.append(_f(node, "error", f"{name}: {what}", replace_fix(node), gpu=g.index))
    if g.remap_failure:
        out.append(_f(node, "error", f"{name}: row remapping failed (no spare rows left in a memory bank)",
                      replace_fix(node), gpu=g.index, remapped_uncorrectable=g.remapped_unc))
    elif g.remap_pending or g.retired_pending or g.flags.get("channel_repair_pending") \
            or g.flags.get("tpc_repair_pending"):
        what = ("row remapping pending" if g.remap_pending else "page retirement pending" if g.retired_pending
                else "memory repair pending")
        out.append(_f(node, "warning", f"{name}: {what}: it takes effect at the next GPU reset",
                      fix_for(xid.RESET_GPU, node, g.index), gpu=g.index))
    if g.recovery_action and g.recovery_action.lower() not in ("none", "n/a"):
        action = xid.REBOOT if "reboot" in g.recovery_action.lower() else xid.RESET_GPU
        out.append(_f(node, "error", f"{name}: the driver asks for recovery: {g.recovery_action}",
                      fix_for(action, node, g.index), gpu=g.index))
    out += _clock_findings(node, name, g)
    out += _pcie_findings(node, name, g)
    if yes_no(g.persistence) is False:
        out.append(_f(node, "warning", f"{name}: persistence mode off (each job start re-initializes the GPU, "
                                       "and a failing GPU is noticed late)",
                      f"`clustertool exec -n {node} -- sudo systemctl enable --now nvidia-persistenced` "
                      "(or `sudo nvidia-smi -pm 1`)", gpu=g.index))
    if g.mem_used and g.mem_used > STRAY_MEMORY_MIB and not g.pids:
        out.append(_f(node, "warning", f"{name}: {g.mem_used} MiB of GPU memory in use but no process listed "
                                       "(a process in another container, or memory a dead process left)",
                      f"`clustertool doctor --check strays --fix` or `clustertool kill --all-python`; if it stays: "
                      f"reset GPU {g.index} or `clustertool reboot --nodes {node}`", gpu=g.index, used_mib=g.mem_used))
    state, status = g.fabric
    if state and state.lower() not in ("n/a", "completed", "not supported") or \
            status and status.lower() not in ("n/a", "success"):
        out.append(_f(node, "error", f"{name}: NVLink fabric {state or '?'} ({status or '?'}): GPUs cannot reach "
                                     "each other over NVLink", f"`clustertool exec -n {node} -- sudo systemctl "
                                     f"restart nvidia-fabricmanager`, else `clustertool reboot --nodes {node}`",
                      gpu=g.index))
    return out


def yes_no(text: str) -> bool | None:
    t = text.strip().lower()
    return True if t in ("enabled", "yes") else False if t in ("disabled", "no") else None


def _clock_findings(node: str, name: str, g: Gpu) -> list[Finding]:
    active = [label for key, label in HW_REASONS.items() if g.reasons.get(key)]
    out = []
    if active:
        out.append(_f(node, "error", f"{name}: clocks held down by {', '.join(active)} (the hardware protects "
                                     "itself: power supply, cooling or a fault); the whole job runs at its pace",
                      f"`clustertool reboot --nodes {node}`; if it stays: {replace_fix(node)}",
                      gpu=g.index, reasons=active, util=g.util))
    if g.reasons.get("sw_thermal_slowdown"):
        out.append(_f(node, "warning", f"{name}: SW thermal slowdown active (the GPU is too hot)",
                      f"check cooling; if only this node is hot: {replace_fix(node)}", gpu=g.index))
    if g.power_limit and g.default_power_limit and g.power_limit < 0.95 * g.default_power_limit:
        out.append(_f(node, "warning", f"{name}: power limit {g.power_limit:.0f} W, below the default "
                                       f"{g.default_power_limit:.0f} W (clocks drop under load)",
                      f"`clustertool exec -n {node} -- sudo nvidia-smi -i {g.index} -pl {g.default_power_limit:.0f}`",
                      gpu=g.index, power_limit=g.power_limit, default=g.default_power_limit))
    return out


def _pcie_findings(node: str, name: str, g: Gpu) -> list[Finding]:
    """Width below the maximum is always a problem: lanes do not come back by themselves. The
    generation is different: an idle GPU lowers it to save power (and nvidia-smi shows the lowered
    one), so a generation below the maximum only counts while the GPU is busy."""
    out = []
    link = f"PCIe gen {g.gen} x{g.width}, the maximum is gen {g.gen_max} x{g.width_max}"
    if g.width and g.width_max and g.width < g.width_max:
        out.append(_f(node, "error", f"{name}: {link}: the link trained at fewer lanes (host <-> GPU copies "
                                     f"run at {g.width / g.width_max:.0%} speed)",
                      f"`clustertool reboot --nodes {node}` (the link trains again); if it stays: {replace_fix(node)}",
                      gpu=g.index, width=g.width, width_max=g.width_max))
    elif g.gen and g.gen_max and g.gen < g.gen_max and (g.util or 0) >= BUSY_UTIL:
        out.append(_f(node, "warning", f"{name}: {link} while {g.util}% busy",
                      f"`clustertool reboot --nodes {node}`; if it stays: {replace_fix(node)}",
                      gpu=g.index, gen=g.gen, gen_max=g.gen_max, util=g.util))
    return out


def _xids(node: str, steps: dict[str, Step], opt: Options, out: list[Finding]) -> list[xid.XidEvent]:
    step = steps.get("xid")
    if step is None:
        return []
    if step.timed_out:
        out.append(_f(node, "warning", f"reading the kernel log did not finish within {opt.box:.0f} s (stopped): "
                                       "Xid events not checked", "raise --gpu-timeout", step="xid", timed_out=True))
    elif step.rc != 0:
        out.append(_f(node, "warning", f"the kernel log could not be read ({step.words or 'exit ' + str(step.rc)}): "
                                       "Xid events not checked",
                      "give the node's user read access to the kernel log (group adm or systemd-journal, or "
                      "sudo without a password)", step="xid"))
    return xid.parse_kernel_log(step.text)


def xid_findings(node: str, events: list[xid.XidEvent], gpus: list[Gpu]) -> list[Finding]:
    """One finding per (Xid, GPU), with how often and when last, the catalogue's meaning and action."""
    index = {xid.bus_device(g.bus_id): g.index for g in gpus}
    groups: dict[tuple[int, str], list[xid.XidEvent]] = {}
    for e in events:
        groups.setdefault((e.xid, e.pci), []).append(e)
    out = []
    for (number, pci), group in sorted(groups.items()):
        last, info = group[-1], group[-1].info
        gpu = index.get(xid.bus_device(pci))
        action = info.action
        if number == 154 and "reboot" in last.message.lower():
            action = xid.REBOOT
        where = f"GPU {gpu} ({pci})" if gpu is not None else f"PCI {pci}"
        when = f", last at {last.when}" if last.when else ""
        proc = f" (process {last.process or '?'} pid {last.pid})" if last.pid else ""
        out.append(_f(node, info.severity,
                      f"Xid {number} on {where}, {len(group)} time(s){when}: {info.meaning}{proc}"
                      + (f" -- driver: {last.message}" if last.message else ""),
                      fix_for(action, node, gpu, info.replace_if),
                      xid=number, gpu=gpu, pci=pci, count=len(group), action=action))
    return out


DCGM_FIX = {9: "cooling", 10: "memory", 11: "NVLink", 12: "NVSwitch", 13: "PCIe", 14: "power"}


def _dcgm(node: str, steps: dict[str, Step], opt: Options) -> list[Finding]:
    step = steps.get("dcgm")
    if step is None:
        return []
    what = f"dcgmi diag -r {opt.deep}"
    if step.rc == 127:
        return [_f(node, "info", f"{what}: DCGM is not installed here (--deep skipped on this node)",
                   "install DCGM (datacenter-gpu-manager) for the deep check", step="dcgm")]
    if step.timed_out:
        return [_f(node, "warning", f"{what} did not finish within {opt.deep_box:.0f} s (stopped; doctor does "
                                    "not wait longer)",
                   f"run it by hand to see where it hangs (`clustertool exec -n {node} -- dcgmi diag -r {opt.deep}`); "
                   f"a hang on one node points at its GPUs: `clustertool reboot --nodes {node}`; "
                   "if DCGM is only slow here, raise --deep-timeout", step="dcgm", timed_out=True)]
    try:
        results, runtime = parse_dcgm(step.text)
    except ValueError as exc:
        return [_f(node, "warning", f"{what} could not run (exit {step.rc}): {exc}",
                   f"is the DCGM host engine running? `clustertool exec -n {node} -- sudo systemctl start "
                   "nvidia-dcgm`", step="dcgm")]
    out = [_f(node, "warning", f"{what} could not run: {runtime}", "check the DCGM install and its host engine",
              step="dcgm")] if runtime else []
    for r in results:
        where = f"GPU {r.gpu}" if r.gpu is not None else "the node"
        area = DCGM_FIX.get(r.error_category or -1)
        fix = (fix_for(xid.RESET_GPU, node, r.gpu, "if it fails again") if area else
               f"fix the software it names (driver, CUDA, DCGM); `clustertool reboot --nodes {node}`")
        out.append(_f(node, "error" if r.status == "Fail" else "warning",
                      f"{what}: {r.test} {'failed' if r.status == 'Fail' else 'warned'} on {where}"
                      + (f" ({area})" if area else "") + (f": {r.messages[0]}" if r.messages else ""),
                      fix, gpu=r.gpu, test=r.test, category=r.category, messages=r.messages))
    return out
