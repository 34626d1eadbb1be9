"""What nvidia-smi says about each GPU, read into one shape from either of its two formats.

Pure functions (stdlib only, importable on a bare GPU machine). The main source is
``nvidia-smi -q -x`` (the XML of nvsmi_device_v*.dtd); ``--query-gpu=... --format=csv`` is the
fallback when the XML step fails. Element names follow the drivers users have: clocks_event_reasons
(R535 and later) or clocks_throttle_reasons (before); ECC counters as sram_/dram_ pairs (R510 and
later) or single_bit/double_bit totals (before). "N/A" reads as unknown (None), never as 0.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# the clocks-event (throttle) reasons by their XML suffix / csv name
REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
           "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown", "display_clocks_setting")


@dataclass
class Gpu:
    index: int                      # enumeration order, as `nvidia-smi -i` counts
    bus_id: str                     # "00000000:53:00.0"
    name: str = ""
    uuid: str = ""
    persistence: str = ""           # Enabled | Disabled
    pstate: str = ""
    util: int | None = None         # GPU utilization, %
    gen: int | None = None          # PCIe link generation now
    gen_max: int | None = None      # the most this GPU and this host can train
    width: int | None = None        # PCIe lanes now
    width_max: int | None = None
    mem_used: int | None = None     # MiB
    mem_total: int | None = None
    power_limit: float | None = None
    default_power_limit: float | None = None
    reasons: dict[str, bool] = field(default_factory=dict)      # clocks-event reason -> active
    ecc_mode: str = ""
    ecc: dict[str, int] = field(default_factory=dict)           # "volatile.dram.uncorrected" -> count
    flags: dict[str, bool] = field(default_factory=dict)        # sram_threshold_exceeded, unrepairable_memory, ...
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_unc: int | None = None
    recovery_action: str = ""       # gpu_recovery_action (R550+): None | GPU Reset Required | ...
    fabric: tuple[str, str] = ("", "")   # NVLink fabric (state, status) on NVSwitch systems
    pids: list[int] = field(default_factory=list)               # processes nvidia-smi lists on it

    def ecc_count(self, scope: str, kind: str) -> int:
        """Sum of ``scope`` (volatile | aggregate) counters of ``kind`` (corrected | uncorrected)."""
        return sum(v for k, v in self.ecc.items() if k.startswith(f"{scope}.") and k.endswith(f".{kind}"))


def number(text: str | None) -> int | None:
    """The leading integer of "16x", "81559 MiB", "0 %", "5"; None for "N/A", "[N/A]", ""."""
    m = re.match(r"\s*(-?\d+)", text or "")
    return int(m.group(1)) if m else None


def real(text: str | None) -> float | None:
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def yes(text: str | None) -> bool | None:
    """Yes/Enabled/Active -> True, No/Disabled/Not Active -> False, N/A -> None."""
    t = (text or "").strip().strip("[]").lower()
    if t in ("yes", "enabled", "active"):
        return True
    if t in ("no", "disabled", "not active"):
        return False
    return None


class SmiError(ValueError):
    """nvidia-smi printed something that is not its XML (or csv)."""


def parse_xml(text: str) -> list[Gpu]:
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        first = text.strip().splitlines()[0][:160] if text.strip() else "nothing"
        raise SmiError(f"not nvidia-smi XML ({exc}): {first}") from None
    return [_gpu(i, el) for i, el in enumerate(root.findall("gpu"))]


def _t(el: ET.Element, path: str) -> str:
    found = el.find(path)
    return (found.text or "").strip() if found is not None else ""


def _children(el: ET.Element, path: str) -> list[ET.Element]:
    found = el.find(path)
    return list(found) if found is not None else []


def _gpu(index: int, g: ET.Element) -> Gpu:
    link = "pci/pci_gpu_link_info"
    gpu = Gpu(index, g.get("id", ""), name=_t(g, "product_name"), uuid=_t(g, "uuid"),
              persistence=_t(g, "persistence_mode"), pstate=_t(g, "performance_state"),
              util=number(_t(g, "utilization/gpu_util")),
              gen=number(_t(g, f"{link}/pcie_gen/current_link_gen")),
              gen_max=number(_t(g, f"{link}/pcie_gen/max_link_gen")),
              width=number(_t(g, f"{link}/link_widths/current_link_width")),
              width_max=number(_t(g, f"{link}/link_widths/max_link_width")),
              mem_used=number(_t(g, "fb_memory_usage/used")), mem_total=number(_t(g, "fb_memory_usage/total")),
              power_limit=real(_t(g, "gpu_power_readings/current_power_limit") or _t(g, "power_readings/power_limit")),
              default_power_limit=real(_t(g, "gpu_power_readings/default_power_limit")
                                       or _t(g, "power_readings/default_power_limit")),
              ecc_mode=_t(g, "ecc_mode/current_ecc"), recovery_action=_t(g, "gpu_recovery_action"),
              fabric=(_t(g, "fabric/state"), _t(g, "fabric/status")))
    for tag in ("clocks_event_reasons", "clocks_throttle_reasons"):
        for child in _children(g, tag):
            active = yes(child.text)
            if active is not None:
                gpu.reasons[re.sub(r"^clocks_(?:event|throttle)_reason_", "", child.tag)] = active
    _ecc(gpu, g)
    gpu.retired_pending = yes(_t(g, "retired_pages/pending_retirement"))
    gpu.remap_pending = yes(_t(g, "remapped_rows/remapped_row_pending"))
    gpu.remap_failure = yes(_t(g, "remapped_rows/remapped_row_failure"))
    gpu.remapped_unc = number(_t(g, "remapped_rows/remapped_row_unc"))
    gpu.pids = [p for p in (number(_t(pi, "pid")) for pi in g.findall("processes/process_info")) if p is not None]
    return gpu


def _ecc(gpu: Gpu, g: ET.Element) -> None:
    errors = g.find("ecc_errors")
    if errors is None:
        return
    for scope in ("volatile", "aggregate"):
        for child in _children(errors, scope):
            tag = child.tag
            if tag in ("single_bit", "double_bit"):    # drivers before R510: per-unit counters and a total
                value, memory = number(_t(child, "total")), "all"
                kind = "corrected" if tag == "single_bit" else "uncorrected"
            elif "correctable" in tag:
                value, memory = number(child.text), tag.split("_")[0] if tag.startswith(("sram", "dram")) else "all"
                kind = "uncorrected" if "uncorrectable" in tag else "corrected"
            else:
                if (flag := yes(child.text)) is not None:
                    gpu.flags[tag] = flag
                continue
            if value is not None:
                key = f"{scope}.{memory}.{kind}"
                gpu.ecc[key] = gpu.ecc.get(key, 0) + value
    for tag in ("channel_repair_pending", "tpc_repair_pending", "unrepairable_memory"):
        if (flag := yes(_t(errors, tag))) is not None:
            gpu.flags[tag] = flag


# --query-gpu fields for the csv fallback (the recorded H100 query, plus utilization.gpu)
CSV_FIELDS = ("index,name,pci.bus_id,uuid,persistence_mode,pstate,utilization.gpu,power.limit,power.default_limit,"
              "memory.used,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
              "pcie.link.width.max,ecc.mode.current,ecc.errors.corrected.volatile.total,"
              "ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,"
              "ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.uncorrectable,"
              "remapped_rows.pending,remapped_rows.failure,"
              + ",".join(f"clocks_event_reasons.{r}" for r in REASONS if r not in ("display_clocks_setting",
                                                                                      "applications_clocks_setting")))


def parse_csv(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=... --format=csv`` (with its header line, units in brackets)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows or "index" not in [h.split(" [")[0] for h in rows[0]]:
        raise SmiError(f"not nvidia-smi csv: {text.strip()[:160] or 'nothing'}")
    head = [h.split(" [")[0].strip() for h in rows[0]]
    out: list[Gpu] = []
    for row in rows[1:]:
        v = dict(zip(head, (c.strip() for c in row)))
        gpu = Gpu(number(v.get("index")) or len(out), v.get("pci.bus_id", ""), name=v.get("name", ""),
                  uuid=v.get("uuid", ""), persistence=v.get("persistence_mode", ""), pstate=v.get("pstate", ""),
                  util=number(v.get("utilization.gpu")), gen=number(v.get("pcie.link.gen.current")),
                  gen_max=number(v.get("pcie.link.gen.max")), width=number(v.get("pcie.link.width.current")),
                  width_max=number(v.get("pcie.link.width.max")), mem_used=number(v.get("memory.used")),
                  mem_total=number(v.get("memory.total")), power_limit=real(v.get("power.limit")),
                  default_power_limit=real(v.get("power.default_limit")), ecc_mode=v.get("ecc.mode.current", ""))
        for scope in ("volatile", "aggregate"):
            for kind, word in (("corrected", "corrected"), ("uncorrected", "uncorrected")):
                if (n := number(v.get(f"ecc.errors.{word}.{scope}.total"))) is not None:
                    gpu.ecc[f"{scope}.all.{kind}"] = n
        gpu.retired_pending = yes(v.get("retired_pages.pending"))
        gpu.remap_pending, gpu.remap_failure = yes(v.get("remapped_rows.pending")), yes(v.get("remapped_rows.failure"))
        gpu.remapped_unc = number(v.get("remapped_rows.uncorrectable"))
        for name, value in v.items():
            if name.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")) and name[-7:] != ".active":
                if (active := yes(value)) is not None:
                    gpu.reasons[name.split(".", 1)[1]] = active
        out.append(gpu)
    return out


def parse_apps(text: str) -> dict[str, list[int]]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits``: GPU uuid -> pids."""
    out: dict[str, list[int]] = {}
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) >= 2 and (pid := number(row[0])) is not None:
            out.setdefault(row[1].strip(), []).append(pid)
    return out
