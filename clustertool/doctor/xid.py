"""NVIDIA Xid events in a node's kernel log: what each number means and what to do about it.

Pure functions (stdlib only). The driver prints one line per event (open-gpu-kernel-modules,
``src/nvidia/src/kernel/gpu/rc/kernel_rc.c``)::

    NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, <message>   (MIG)

and older drivers print ``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.`` with no
pid.  The meanings and the immediate action come from NVIDIA's Xid catalogue ("Analyzing Xid
Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors): its resolution buckets
RESTART_APP, RESET_GPU, RESTART_BM (reboot the machine), IGNORE, CONTACT_SUPPORT, worded here
for a cloud node, where "contact support" means replacing the instance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# action words, in increasing weight
RESTART_APP, RESET_GPU, REBOOT, REPLACE = "restart the application", "reset the GPU", "reboot", "replace"


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    action: str          # one of the action words above
    severity: str        # error | warning | info
    replace_if: str = ""  # when the catalogue's next step (contact support) applies: then replace the node


# Xid -> what it means, what to do, how bad; the catalogue's mnemonic after each.
CATALOGUE: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing", RESTART_APP, "warning"),  # FIFO_ERROR_IDLE_TIMEOUT
    13: XidInfo("graphics engine exception (often a bug in the program or CUDA library, e.g. an "
                "out-of-range access)", RESTART_APP, "warning"),  # GR_EXCEPTION
    31: XidInfo("GPU memory page fault (an illegal address: usually the program; on one node only, "
                "suspect the GPU)", RESTART_APP, "warning"),  # FIFO_ERROR_MMU_ERR_FLT
    32: XidInfo("invalid or corrupted push buffer stream", RESTART_APP, "warning"),  # PBDMA_ERROR
    43: XidInfo("GPU stopped processing (a program hit an error; the GPU is still usable)",
                RESTART_APP, "info"),  # RESETCHANNEL_VERIF_ERROR
    45: XidInfo("preemptive cleanup after an earlier error (follow the other Xids here)",
                RESTART_APP, "info"),  # PREEMPTIVE_REMOVAL
    46: XidInfo("GPU stopped processing", RESET_GPU, "error"),  # GPU_TIMEOUT_ERROR
    48: XidInfo("double-bit (uncorrectable) ECC error in GPU memory", RESET_GPU, "error",
                "if it comes back after the reset"),  # GPU_ECC_DBE
    61: XidInfo("internal micro-controller breakpoint/warning", RESET_GPU, "error"),  # PMU_BREAKPOINT
    62: XidInfo("internal micro-controller halt", RESET_GPU, "error"),  # PMU_HALT_ERROR
    63: XidInfo("GPU memory row remapping (or page retirement) recorded; it takes effect at the next "
                "GPU reset", RESET_GPU, "warning"),  # INFOROM_DRAM_RETIREMENT_EVENT
    64: XidInfo("GPU memory row remapping (or page retirement) failed", REPLACE,
                "error"),  # INFOROM_DRAM_RETIREMENT_FAILURE
    74: XidInfo("NVLink error", RESET_GPU, "error", "if it comes back"),  # NVLINK_ERROR
    79: XidInfo("GPU has fallen off the bus (it no longer answers on PCIe)", REBOOT, "error",
                "if it happens again"),  # GPU_HAS_FALLEN_OFF_THE_BUS
    92: XidInfo("high single-bit ECC error rate", RESTART_APP, "warning",
                "if it keeps growing"),  # EXCESSIVE_SBE_INTERRUPTS
    94: XidInfo("contained memory error (the program using the bad memory was stopped; the GPU goes on)",
                RESTART_APP, "warning"),  # CONTAINED_ERROR
    95: XidInfo("uncontained memory error", RESET_GPU, "error"),  # UNCONTAINED_ERROR
    109: XidInfo("context switch timeout", RESET_GPU, "error"),  # CTXSW_TIMEOUT_ERROR
    119: XidInfo("GSP RPC timeout (the GPU's system processor stopped answering)", RESET_GPU,
                 "error"),  # GSP_RPC_TIMEOUT
    120: XidInfo("GSP error", RESET_GPU, "error"),  # GSP_ERROR
    136: XidInfo("link training failed", RESET_GPU, "error"),  # ALI_TRAINING_FAIL
    140: XidInfo("unrecovered ECC error", RESET_GPU, "error", "if it comes back"),  # UNRECOVERABLE_ECC_ERROR_ESCAPE
    143: XidInfo("GPU initialization error", RESET_GPU, "error"),  # GPU_INIT_ERROR
    154: XidInfo("the driver changed the GPU's recovery action (the line says which: reset or reboot)",
                 RESET_GPU, "error"),  # GPU_RECOVERY_ACTION_CHANGED
}

# NVRM: Xid (PCI:0000:53:00[ GPU-I:01 GPU-CI:00]): 79[, pid=..., name=...][, message]
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                     r"(?:\.\d)?(?P<mig>[^)]*)\): (?P<xid>\d+)(?:, (?P<rest>.*))?$")
_PID_RE = re.compile(r"^pid=(?P<pid>'?[^,]*?'?), name=(?P<name>[^,]*), ?")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str            # "0000:53:00": domain:bus:device as the driver prints it
    message: str        # the driver's words after the number (pid and name removed)
    when: str           # the log line's time prefix, as the log printed it ("" when none)
    pid: str = ""
    process: str = ""

    @property
    def info(self) -> XidInfo:
        return CATALOGUE.get(self.xid, XidInfo("not in the catalogue table here", RESET_GPU, "warning"))


def parse_kernel_log(text: str) -> list[XidEvent]:
    """Every Xid line of a kernel log (journalctl -k or dmesg output, any prefix)."""
    out = []
    for line in text.splitlines():
        m = _XID_RE.search(line)
        if not m:
            continue
        rest, pid, process = (m.group("rest") or "").strip(), "", ""
        if p := _PID_RE.match(rest):
            pid, process, rest = p.group("pid").strip("'"), p.group("name").strip(), rest[p.end():]
        out.append(XidEvent(int(m.group("xid")), m.group("pci").lower(), rest.strip(), _when(line[:m.start()]),
                            "" if pid == "<unknown>" else pid, "" if process == "<unknown>" else process))
    return out


def _when(prefix: str) -> str:
    """The time a log line starts with: ``2026-11-26T10:41:02+0000`` (journalctl -o short-iso),
    ``[ 1234.5678]`` (dmesg), else nothing."""
    prefix = prefix.strip()
    if m := re.match(r"^\[\s*([^\]]+)\]", prefix):
        return m.group(1).strip()
    first = prefix.split(" ", 1)[0] if prefix else ""
    return first if re.match(r"^\d{4}-\d\d-\d\dT", first) else ""


def bus_device(pci: str) -> tuple[str, str]:
    """("53", "00") from "0000:53:00", "00000000:53:00.0" or "0000:53:00.0": how a kernel-log Xid is
    matched to nvidia-smi's GPU (the driver prints no function number, nvidia-smi an 8-digit domain)."""
    parts = pci.lower().split(".")[0].split(":")
    return (parts[-2], parts[-1]) if len(parts) >= 3 else ("", "")
