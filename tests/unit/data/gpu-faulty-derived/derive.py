"""Writes the faulty recordings in this folder from the real H100 recording (../gpu-h100-recorded)
and from the formats NVIDIA, libfabric and NCCL document (README.md says which). Run it from the
repository root to write them again: python tests/unit/data/gpu-faulty-derived/derive.py
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "gpu-h100-recorded"
# p5.48xlarge's eight GPUs sit on these buses; 0x64 is the one that "fell off the bus"
BUSES = ["53", "75", "86", "97", "a8", "b9", "ca"]
MISSING = "64"


def set_text(gpu: ET.Element, path: str, value: str) -> None:
    el = gpu.find(path)
    assert el is not None, path
    el.text = value


def smi_xml() -> str:
    root = ET.fromstring((REAL / "smi-xml.out").read_text().split("\n", 2)[2])  # without <?xml?> and DOCTYPE
    real = root.find("gpu")
    assert real is not None
    for clocks in real.findall("supported_clocks"):
        real.remove(clocks)        # 20 KB of clock tables per GPU that no check reads
    root.remove(real)
    set_text(root, "attached_gpus", str(len(BUSES)))
    for i, bus in enumerate(BUSES):
        g = copy.deepcopy(real)
        g.set("id", f"00000000:{bus.upper()}:00.0")
        set_text(g, "pci/pci_bus", bus.upper())
        set_text(g, "pci/pci_device", "00")
        set_text(g, "pci/pci_bus_id", f"00000000:{bus.upper()}:00.0")
        set_text(g, "minor_number", str(i if bus < MISSING else i + 1))
        set_text(g, "uuid", f"GPU-5ef4129f-cdb8-c223-af49-51751ee12c{i:02d}")
        FAULTS.get(i, lambda _g: None)(g)
        root.append(g)
    ET.indent(root, "\t")
    return '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n' + \
        ET.tostring(root, encoding="unicode") + "\n"


def idle_gen1(g):                   # GPU 0: idle, link down-shifted to gen 1 to save power (fine)
    set_text(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen", "1")
    set_text(g, "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen", "1")


def dbe_remap_pending(g):           # GPU 1: two uncorrectable DRAM errors, a row remap waiting for a reset
    for scope in ("volatile", "aggregate"):
        set_text(g, f"ecc_errors/{scope}/dram_uncorrectable", "2")
    set_text(g, "remapped_rows/remapped_row_unc", "1")
    set_text(g, "remapped_rows/remapped_row_pending", "Yes")


def remap_failed(g):                # GPU 2: a bank out of spare rows
    set_text(g, "ecc_errors/aggregate/dram_uncorrectable", "9")
    set_text(g, "remapped_rows/remapped_row_unc", "8")
    set_text(g, "remapped_rows/remapped_row_failure", "Yes")


def hw_slowdown(g):                 # GPU 3: busy, held down by HW slowdown and the power brake
    r = "clocks_event_reasons/clocks_event_reason_"
    set_text(g, r + "gpu_idle", "Not Active")
    set_text(g, r + "hw_slowdown", "Active")
    set_text(g, r + "hw_power_brake_slowdown", "Active")
    set_text(g, "utilization/gpu_util", "97 %")
    set_text(g, "clocks/sm_clock", "1005 MHz")


def narrow_link(g):                 # GPU 4: PCIe trained at x8 of x16
    set_text(g, "pci/pci_gpu_link_info/link_widths/current_link_width", "8x")


def no_persistence(g):              # GPU 5
    set_text(g, "persistence_mode", "Disabled")


def held_memory_busy_gen3(g):       # GPU 6: 30 GiB held with no process; busy at gen 3 of 5
    set_text(g, "fb_memory_usage/used", "30720 MiB")
    set_text(g, "fb_memory_usage/free", "50359 MiB")
    set_text(g, "utilization/gpu_util", "88 %")
    set_text(g, "clocks_event_reasons/clocks_event_reason_gpu_idle", "Not Active")
    set_text(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen", "3")


FAULTS = {0: idle_gen1, 1: dbe_remap_pending, 2: remap_failed, 3: hw_slowdown, 4: narrow_link,
          5: no_persistence, 6: held_memory_busy_gen3}


def smi_csv() -> str:
    """The real --query-gpu csv, its one row turned into GPU 4's fault (x8 of x16)."""
    head, row = (REAL / "smi-query.out").read_text().splitlines()[:2]
    cells = row.split(", ")
    names = [h.split(" [")[0] for h in head.split(", ")]
    cells[names.index("pcie.link.width.current")] = "8"
    return head + "\n" + ", ".join(cells) + "\n"


def journal() -> str:
    """`journalctl -k -o short-iso -b`: the real driver lines of this boot, then Xid 79 (the missing GPU),
    48 and 63 (GPU 1) in the driver's format (kernel_rc.c), with NVIDIA's documented message words."""
    host, t = "ip-10-1-0-13", "2026-11-26T{}+0000"
    real = [ln.split("] ", 1)[1] for ln in (REAL / "dmesg-xid.out").read_text().splitlines()]
    lines = [f"{t.format('08:00:01')} {host} kernel: {ln}" for ln in real]
    lines += [f"{t.format('09:12:44')} {host} kernel: NVRM: GPU at PCI:0000:{MISSING}:00: "
              "GPU-5ef4129f-cdb8-c223-af49-51751ee12cff",
              f"{t.format('09:12:44')} {host} kernel: NVRM: Xid (PCI:0000:{MISSING}:00): 79, pid='<unknown>', "
              "name=<unknown>, GPU has fallen off the bus.",
              f"{t.format('09:12:44')} {host} kernel: NVRM: GPU 0000:{MISSING}:00.0: GPU has fallen off the bus.",
              f"{t.format('09:40:02')} {host} kernel: NVRM: Xid (PCI:0000:75:00): 48, pid=41227, name=python3, "
              "An uncorrectable double bit error (DBE) has been detected on GPU (0000:75:00).",
              f"{t.format('09:40:02')} {host} kernel: NVRM: Xid (PCI:0000:75:00): 63, pid=41227, name=python3, "
              "Row Remapper: New row marked for remapping, reset gpu to activate.",
              f"{t.format('09:41:17')} {host} kernel: NVRM: Xid (PCI:0000:75:00): 48, pid=41390, name=python3, "
              "An uncorrectable double bit error (DBE) has been detected on GPU (0000:75:00)."]
    return "\n".join(lines) + "\n"


def dcgm() -> str:
    """`dcgmi diag -r 2 -j` in DCGM 4's shape (dcgmi/Diag.cpp HelperJsonBuildOutput), messages and
    codes from dcgmlib/dcgm_errors.h: GPU 1 row remap pending (85), GPU 2 remap failed (80) and a
    memory mismatch in the memory test (58)."""
    def result(gpu, status, warnings=()):
        r = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
        if warnings:
            r["warnings"] = [{"warning": w, "error_id": e, "error_category": c, "error_severity": s}
                             for w, e, c, s in warnings]
        return r

    gpus = range(len(BUSES))
    software = [result(g, "Fail", [("GPU 1 had memory errors and row remappings are pending", 85, 10, 6)])
                if g == 1 else
                result(g, "Fail", [("GPU 2 had uncorrectable memory errors and row remapping failed.", 80, 10, 6)])
                if g == 2 else result(g, "Pass") for g in gpus]
    memory = [result(g, "Fail", [("A memory mismatch was detected on GPU 2, but no error was reported by CUDA "
                                  "or NVML.", 58, 10, 2)]) if g == 2 else result(g, "Pass") for g in gpus]
    doc = {
        "DCGM Diagnostic": {"test_categories": [
            {"category": "Deployment", "tests": [{"name": "software", "results": software,
                                                  "test_summary": {"status": "Fail"}}]},
            {"category": "Integration", "tests": [{"name": "pcie", "results": [result(g, "Pass") for g in gpus],
                                                   "test_summary": {"status": "Pass"}}]},
            {"category": "Hardware", "tests": [{"name": "memory", "results": memory,
                                                "test_summary": {"status": "Fail"}}]},
        ]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                           "entities": [{"entity_id": g, "device_id": "2330", "serial_num": f"175262401245{g}"}
                                        for g in gpus]}],
        "metadata": {"version": "4.2.3", "Driver Version Detected": "580.159.04"},
    }
    return json.dumps(doc, indent=4) + "\n"


def fi_info(devices: list[str]) -> str:
    """`fi_info -p efa` (libfabric util/info.c print_short_info; EFA domains `<device>-rdm|-dgrm`)."""
    out = []
    for dev in devices:
        for suffix, ep in (("rdm", "FI_EP_RDM"), ("dgrm", "FI_EP_DGRAM")):
            out += ["provider: efa", "    fabric: efa", f"    domain: {dev}-{suffix}", "    version: 122.0",
                    f"    type: {ep}", "    protocol: FI_PROTO_EFA"]
    return "\n".join(out) + "\n"


def nccl(hosts: list[str], efa: bool) -> str:
    """An NCCL 2.21 INFO log (src/debug.cc prefix) of two p4d nodes, 8 ranks each: over aws-ofi-nccl on
    4 EFA NICs, or fallen back to sockets."""
    lines = []
    for h, host in enumerate(hosts):
        for local in range(8):
            rank, pid = 8 * h + local, 5100 + local
            p = f"{host}:{pid}:{pid} [{local}] NCCL INFO "
            if rank == 0:
                lines.append(p + "NCCL version 2.21.5+cuda12.4")
            if efa:
                lines += [p + "NET/OFI Initializing aws-ofi-nccl 1.14.0",
                          p + "NET/OFI Using Libfabric version 1.22",
                          p + "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
                          p + "Using network Libfabric"]
            else:
                lines += [p + "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
                          p + f"NET/Socket : Using [0]ens32:10.1.0.{11 + h}<0>",
                          p + "Using network Socket"]
            lines.append(p + f"comm 0x55d0c0a1e2f0 rank {rank} nRanks 16 nNodes 2 localRanks 8 localRank {local} "
                             "MNNVL 0")
            dev = local // 2 if efa else 0
            net = f"Libfabric/{dev}/GDRDMA" if efa else "Socket/0"
            peer = (rank + 8) % 16
            lines += [p + f"Channel 00/0 : {peer}[{local}] -> {rank}[{local}] [receive] via NET/{net}",
                      p + f"Channel 00/0 : {rank}[{local}] -> {peer}[{local}] [send] via NET/{net}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    files = {
        "smi-xml-p5-faulty.out": smi_xml(),
        "smi-query-x8.out": smi_csv(),
        "journal-k-xid.out": journal(),
        "dcgmi-diag-r2-fail.json": dcgm(),
        "fi-info-p4d-3of4.out": fi_info(["rdmap16s27", "rdmap32s27", "rdmap144s27"]),
        "fi-info-p4d-4of4.out": fi_info(["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]),
        "nccl-efa-4nics.log": nccl(["ip-10-1-0-11", "ip-10-1-0-12"], efa=True),
        "nccl-socket-fallback.log": nccl(["ip-10-1-0-11", "ip-10-1-0-12"], efa=False),
    }
    for name, text in files.items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
