"""`doctor --check efa`: EFA devices per node, and which network NCCL really used.

Pure functions (stdlib only). Sources and their formats:

- nodeprogs/efa_health.sh: the host name, the kernel's EFA devices (sysfs), aws-ofi-nccl's library
  and ``fi_info -p efa`` (libfabric util/info.c print_short_info: ``provider:``, ``fabric:``,
  ``domain:`` ... per entry; the EFA provider names each domain after its device, ``<dev>-rdm`` or
  ``<dev>-dgrm``, prov/efa/src/efa_prov_info.c, and libfabric 2 lists each device again under the
  ``efa-direct`` fabric).
- An NCCL_DEBUG=INFO log (`plugin check`'s job, or any job): NCCL's ``Using network %s``
  (src/init.cc), ``Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d...`` (src/transport/net.cc:
  the net device each connection uses), ``nNodes %d localRanks %d`` (src/init.cc), each line after
  ``host:pid:tid [cudaDev] NCCL INFO`` (src/debug.cc); and aws-ofi-nccl's ``NET/OFI Selected Provider
  is %s (found %d nics)`` (up to v1.9) or ``NET/OFI Selected provider is %s, fabric is %s (found %d
  nics)`` (v1.14 on, src/nccl_ofi_net.cpp).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from clustertool.doctor.findings import Finding

MARK = "@@ct-efa"

# EFA interfaces per instance type: one per network card, the most AWS attaches for full bandwidth
# (describe_instance_types: NetworkInfo.NetworkCards / EfaInfo.MaximumEfaInterfaces). Used where the
# node does not record what `up` attached (node.extra["efa_interfaces"], AWS provider).
EXPECTED_EFA = {"p3dn.24xlarge": 1, "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32,
                "p5e.48xlarge": 32, "p5en.48xlarge": 16}


@dataclass
class NodeEfa:
    host: str = ""
    sysfs: list[str] = field(default_factory=list)
    ofi_nccl: list[str] = field(default_factory=list)
    fi_rc: int | None = None
    fi_devices: list[str] = field(default_factory=list)


def parse_node(text: str) -> NodeEfa:
    out, fi_lines, in_fi = NodeEfa(), [], False
    for line in text.splitlines():
        if in_fi:
            fi_lines.append(line)
        elif line.startswith("host "):
            out.host = line[5:].strip()
        elif line.startswith("sysfs"):
            out.sysfs = line.split()[1:]
        elif line.startswith("ofi_nccl "):
            out.ofi_nccl.append(line[9:].strip())
        elif m := re.match(rf"^{MARK} fi_info rc=(-?\d+)", line):
            out.fi_rc, in_fi = int(m.group(1)), True
    out.fi_devices = fi_info_devices("\n".join(fi_lines)) if out.fi_rc == 0 else []
    return out


def fi_info_devices(text: str) -> list[str]:
    """The EFA devices ``fi_info -p efa`` lists (each appears once per endpoint type and fabric)."""
    devices, provider = [], ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "provider":
            provider = value
        elif key == "domain" and provider.split(";")[0] == "efa":
            device = re.sub(r"-(rdm|dgrm)$", "", value)
            if device not in devices:
                devices.append(device)
    return devices


def expected_efa(extra: dict[str, Any], instance_type: str) -> tuple[int | None, int | None]:
    """(EFA interfaces `up` attached, as recorded on the node; the type's count from the table)."""
    attached = extra.get("efa_interfaces")
    return (int(attached) if isinstance(attached, int) else None), EXPECTED_EFA.get(instance_type)


def _f(node: str | None, severity: str, message: str, fix: str, **data: Any) -> Finding:
    return Finding("efa", node, severity, message, fix=fix, data=data)


def node_findings(node: str, efa: NodeEfa, *, attached: int | None, type_count: int | None,
                  instance_type: str, box: float, peers: int = 0) -> list[Finding]:
    """What fi_info and the kernel show against what the node should have: what `up` attached, else what
    its type has, else ``peers`` (the most the cluster's other nodes show: its nodes are alike)."""
    out = []
    want = attached if attached is not None else type_count or peers
    basis = ("attached at up" if attached is not None else f"a {instance_type} has" if type_count
             else "the other nodes show that many")
    if attached == 0 and type_count:
        out.append(_f(node, "warning", f"no EFA interface attached; a {instance_type} has {type_count} network "
                                       "card(s) for EFA: NCCL runs over TCP here",
                      "bring the cluster up with `clustertool up --efa` (one EFA interface per network card)",
                      attached=0, type_count=type_count))
    elif attached and type_count and attached < type_count:
        out.append(_f(node, "warning", f"{attached} EFA interface(s) attached, a {instance_type} has {type_count} "
                                       "network cards: the rest of its bandwidth is unused",
                      "`clustertool up --efa` attaches one EFA interface per network card",
                      attached=attached, type_count=type_count))
    if efa.fi_rc in (124, 137):
        out.append(_f(node, "warning", f"fi_info -p efa did not answer within {box:.0f} s (stopped)",
                      f"`clustertool reboot --nodes {node}` if EFA hangs there", timed_out=True))
    elif efa.fi_rc == 127 and (efa.sysfs or want):
        out.append(_f(node, "warning", "libfabric's fi_info is not installed: what libfabric sees of EFA is "
                                       "not checked", "install the EFA software (aws-efa-installer; the Deep "
                                                      "Learning AMI has it in /opt/amazon/efa)"))
    seen = len(efa.fi_devices) if efa.fi_rc == 0 else len(efa.sysfs)
    how = "fi_info -p efa lists" if efa.fi_rc == 0 else "the kernel shows"
    if want and seen < want:
        out.append(_f(node, "error", f"{how} {seen} EFA device(s), {want} expected ({basis})"
                      + (f": {', '.join(efa.fi_devices or efa.sysfs)}" if seen else ""),
                      f"an EFA device is missing or its driver did not load: `clustertool reboot --nodes {node}`; "
                      f"if it stays: `clustertool cordon {node}` and replace the instance",
                      found=seen, expected=want, devices=efa.fi_devices or efa.sysfs))
    elif efa.fi_rc == 0 and len(efa.fi_devices) < len(efa.sysfs):
        out.append(_f(node, "error", f"the kernel shows {len(efa.sysfs)} EFA device(s) but libfabric opens only "
                                     f"{len(efa.fi_devices)}", "update the EFA software (aws-efa-installer) and "
                                     f"`clustertool reboot --nodes {node}`", sysfs=efa.sysfs, fi_info=efa.fi_devices))
    return out


# ---- NCCL's log -----------------------------------------------------------------------------

_PREFIX_RE = re.compile(r"(?P<host>[^\s:\[\]<>]+):\d+:\d+ \[\d+\] NCCL (?:INFO|WARN) ")
_USING_RE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_OFI_RE = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<prov>[^,\s]+)(?:, fabric is (?P<fabric>[^(]+?))? "
                     r"\(found (?P<nics>\d+) nics?\)")
_VIA_RE = re.compile(r"\[(?:send|receive)\] via NET/(?P<net>.+?)/(?P<dev>\d+)(?=[(/\s]|$)")
_LOCAL_RE = re.compile(r"nNodes (\d+) localRanks (\d+)")


@dataclass
class NetUse:
    """What one host's ranks said about the network NCCL used."""

    network: str | None = None
    provider: str | None = None      # aws-ofi-nccl's libfabric provider
    nics_found: int | None = None    # ... and how many NICs it found
    devices: set[int] = field(default_factory=set)   # NCCL's net devices in "via NET/<net>/<dev>"
    local_ranks: int = 0


def nccl_net_use(text: str) -> dict[str, NetUse]:
    """Per host (NCCL's host name, up to the first dot), from an NCCL_DEBUG=INFO log; lines
    without NCCL's prefix count under ""."""
    out: dict[str, NetUse] = {}
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        m = _PREFIX_RE.search(line)
        use = out.setdefault(m.group("host") if m else "", NetUse())
        if u := _USING_RE.search(line):
            use.network = u.group(1)
        if o := _OFI_RE.search(line):
            use.provider, use.nics_found = o.group("prov"), int(o.group("nics"))
        if v := _VIA_RE.search(line):
            use.devices.add(int(v.group("dev")))
        if lr := _LOCAL_RE.search(line):
            use.local_ranks = max(use.local_ranks, int(lr.group(2)))
    return {h: u for h, u in out.items() if u.network or u.provider or u.devices}


SOCKET_FIX = ("use aws-ofi-nccl: on the Deep Learning AMI it is in /opt/amazon/ofi-nccl; put its lib folder first "
              "on the ranks' LD_LIBRARY_PATH (`clustertool run -x LD_LIBRARY_PATH=...`), set FI_PROVIDER=efa, "
              "and bring nodes up with `clustertool up --efa`; NCCL_NET='AWS Libfabric' makes NCCL stop with "
              "an error instead of falling back to sockets")


def nccl_findings(uses: dict[str, NetUse], expected: dict[str, int], source: str,
                  node_of: dict[str, str] | None = None) -> list[Finding]:
    """``expected``: EFA devices per NCCL host name ("" for hosts that are not known nodes);
    ``node_of``: NCCL host name -> node name, to name the node in the finding."""
    out = []
    for host, use in sorted(uses.items()):
        want = expected.get(host, expected.get("", 0))
        node = (node_of or {}).get(host)
        where = node or host or "the ranks"
        data = {"host": host, "network": use.network, "provider": use.provider, "nics_found": use.nics_found,
                "devices_used": sorted(use.devices), "expected_efa": want, "log": source}
        problem = _nccl_problem(use, want)
        if problem and want:
            out.append(_f(node, "error", f"{where}: {problem} ({source})", problem_fix(problem), **data))
        else:
            out.append(_f(node, "info", f"{where}: NCCL used {use.network or '?'}"
                          + (f", provider {use.provider} ({use.nics_found} NICs)" if use.provider else "")
                          + f", {len(use.devices)} net device(s) ({source})", "", **data))
    return out


def _nccl_problem(use: NetUse, want: int) -> str:
    if use.network in ("Socket", "IB"):
        return (f"NCCL fell back to {'TCP sockets (NET/Socket)' if use.network == 'Socket' else 'its IB transport'}"
                f", not EFA ({want} EFA device(s) here)")
    if use.provider and not use.provider.startswith("efa"):
        return f"aws-ofi-nccl chose libfabric provider {use.provider}, not efa"
    if use.nics_found is not None and 1 < want and use.nics_found < want:
        return f"aws-ofi-nccl found {use.nics_found} EFA NIC(s) of {want}"
    if len(use.devices) == 1 and want > 1 and use.local_ranks > 1:
        return f"NCCL sent every connection through one net device (of {want} EFA) with {use.local_ranks} local ranks"
    return ""


def problem_fix(problem: str) -> str:
    if "provider" in problem:
        return "set FI_PROVIDER=efa for the ranks and check `clustertool doctor --check efa` (fi_info) on every node"
    if "found" in problem or "one net device" in problem:
        return ("a node misses EFA devices (see the efa findings per node), or NCCL_OFI/FI_ variables limit them: "
                "unset FI_EFA_* / OFI_NCCL_* overrides in the job; `clustertool reboot` the node missing devices")
    return SOCKET_FIX
