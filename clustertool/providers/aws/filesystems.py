"""Shared filesystems of an AWS cluster: EFS and FSx for Lustre made (or attached) at `up`, removed at `down`.

What the user asked for arrives as ``cluster.options["shared_fs"]`` (a list of ``{"kind", "id",
"mount"}``, parsed by ``clustertool.sharedfs.specs``); what this module made or attached is
``cluster.provider_state["shared_fs"]``, one entry per file system::

    {"kind": "efs"|"fsx", "id": "fs-...", "mount": "/shared", "made": bool, "dns": str|None,
     "mount_name": str|None, "source": "DNS:/" | "DNS@tcp:/MOUNTNAME", "group": "sg-..."|None,
     "mount_target": "fsmt-..."|None, ...}

saved the moment each resource exists (like instances), so an interrupted `up` can be undone; and
everything new is tagged with the cluster's id, so a SIGKILLed `up`'s file systems are found by
`down` and `down --sweep` too.  Timeline: ``check`` (before anything is made: flags, attached ids
exist), ``start`` in `up` once the zone is known (groups, file systems, EFS mount targets),
``ready`` after the instances (waits, FSx mount names, the PERSISTENT_2 import), ``remove`` in
`down` (mount targets, file systems, their groups; attached ones are never deleted).
"""

from __future__ import annotations

import time
from typing import Callable

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Reporter
from clustertool.providers.aws import efs, fsx, tags
from clustertool.providers.aws.client import Aws, aws_errors

ROLE = "shared-fs"
KEPT = "clustertool:kept-from"
HOURS_PER_MONTH = 730.0
EFS_GB_MONTH = 0.30  # Standard storage, approximate us-east-1 list price
EFS_MIBPS_MONTH = 6.00  # provisioned throughput, per MiB/s-month
FSX_GB_MONTH = {"SCRATCH_2": 0.140, "SCRATCH_1": 0.140, "PERSISTENT_2": 0.145, "PERSISTENT_1": 0.145}
PRICE_BASIS = "approximate us-east-1 list prices"
LUSTRE_CLIENT_HINT = ("nodes need the Lustre client (Ubuntu: lustre-client-modules-$(uname -r); Amazon Linux: "
                      "lustre-client); Deep Learning AMIs carry it")
Record = Callable[[str, str], None]


def wanted(options: dict) -> list[dict]:
    return [dict(w) for w in options.get("shared_fs") or []]


def validate(options: dict) -> None:
    """Offline checks: kinds this provider makes, and flags that go with a kind."""
    kinds = {w.get("kind") for w in wanted(options)}
    if "local" in kinds:
        raise UsageError("--shared-fs local is the local provider's stand-in; on AWS use efs or fsx",
                         hint="--shared-fs efs (NFS, grows as you write) or --shared-fs fsx (Lustre, from S3)")
    new_fsx = any(w["kind"] == "fsx" and not w.get("id") for w in wanted(options))
    for key in ("fsx_capacity", "fsx_deployment", "fsx_import"):
        if options.get(key) is not None and not new_fsx:
            raise UsageError(f"--{key.replace('_', '-')} goes with a new FSx file system",
                             hint="add --shared-fs fsx (an attached fsx:fs-... keeps its own settings)")
    if options.get("efs_throughput"):
        if not any(w["kind"] == "efs" and not w.get("id") for w in wanted(options)):
            raise UsageError("--efs-throughput goes with a new EFS file system", hint="add --shared-fs efs")
        throughput(options)
    if new_fsx:
        fsx.check_capacity(_deployment(options), _capacity(options))
        fsx.check_import(options.get("fsx_import"))


def throughput(options: dict) -> tuple[str, float | None]:
    """--efs-throughput as (mode, provisioned MiB/s): elastic | bursting | provisioned:MIBPS."""
    text = str(options.get("efs_throughput") or "elastic").strip().lower()
    mode, _, rate = text.partition(":")
    if mode in ("elastic", "bursting") and not rate:
        return mode, None
    if mode == "provisioned":
        try:
            mibps = float(rate)
        except ValueError:
            mibps = 0.0
        if 1.0 <= mibps <= 10240.0:
            return mode, mibps
    raise UsageError(f"--efs-throughput {text!r}: expected elastic, bursting or provisioned:MIBPS (1-10240)",
                     hint="e.g. --efs-throughput provisioned:256")


def _deployment(options: dict) -> str:
    return str(options.get("fsx_deployment") or "SCRATCH_2")


def _capacity(options: dict) -> int:
    return int(options.get("fsx_capacity") or 1200)


def check(aws: Aws, options: dict) -> list[str]:
    """Before anything is made: attached file systems exist (one line if not); notes for the user."""
    notes = []
    for want in wanted(options):
        if want.get("id"):
            found = efs.existing(aws, want["id"]) if want["kind"] == "efs" else fsx.existing(aws, want["id"])
            notes.append(f"shared fs: attach {want['kind']} {found.get('FileSystemId')} at {want['mount']} "
                         "(never deleted by down)")
    return notes


def lustre_line(options: dict, image_name: str | None) -> str | None:
    """Whether the node image can mount Lustre, as far as its name tells (said before anything is made)."""
    if not any(w["kind"] == "fsx" for w in wanted(options)):
        return None
    if image_name and "deep learning" in image_name.lower():
        return "Lustre client: the image is a Deep Learning AMI, which carries it"
    return (f"Lustre client: image {image_name or '?'} is not a Deep Learning AMI: {LUSTRE_CLIENT_HINT}; "
            "mounting checks for it on each node and stops with one line if it is missing")


def monthly(entry: dict) -> tuple[float | None, str]:
    """(USD per month, how): FSx by its capacity; EFS by the data it holds (None: not known here)."""
    if entry["kind"] == "fsx":
        rate = FSX_GB_MONTH.get(entry.get("deployment") or "", FSX_GB_MONTH["SCRATCH_2"])
        size = int(entry.get("size_gib") or 0)
        if size:
            return size * rate, f"{size} GiB {entry.get('deployment') or 'Lustre'} at ${rate:.3f}/GB-month"
        return None, f"${rate:.3f}/GB-month of capacity"
    fixed, extra = 0.0, ""
    if entry.get("mibps"):
        fixed = float(entry["mibps"]) * EFS_MIBPS_MONTH
        extra = f" + {entry['mibps']:g} MiB/s provisioned at ${EFS_MIBPS_MONTH:.2f}/MiB/s-month"
    size_gb = entry.get("size_bytes")
    if size_gb is not None:
        gb = float(size_gb) / 1e9
        return (gb * EFS_GB_MONTH + fixed,
                f"{gb:,.1f} GB stored now at ${EFS_GB_MONTH:.2f}/GB-month; grows with the data{extra}")
    return None, f"${EFS_GB_MONTH:.2f}/GB-month of data stored{extra}"


def price_line(entry: dict) -> str:
    total, how = monthly(entry)
    return (f"about ${total:,.2f}/month ({how}, {PRICE_BASIS})" if total is not None
            else f"about {how} ({PRICE_BASIS})")


def plan_lines(options: dict, name: str, image_name: str | None) -> list[str]:
    lines = []
    for want in wanted(options):
        kind, at = want["kind"], want["mount"]
        if want.get("id"):
            lines.append(f"shared fs: attach {kind} {want['id']} at {at}: nothing of it is deleted by down"
                         + ("; a mount target in the cluster's subnet if it has none (removed by down)"
                            if kind == "efs" else ""))
        elif kind == "efs":
            lines.append(f"shared fs: new EFS at {at} (encrypted, general purpose, "
                         f"{options.get('efs_throughput') or 'elastic'} throughput), a mount target in the "
                         f"cluster's subnet, a group admitting TCP {efs.NFS_PORT} from the cluster's group only; "
                         f"{price_line({'kind': 'efs', 'mibps': throughput(options)[1]})}")
        else:
            entry = {"kind": "fsx", "size_gib": _capacity(options), "deployment": _deployment(options)}
            source = options.get("fsx_import")
            lines.append(f"shared fs: new FSx for Lustre at {at}, {_capacity(options)} GiB {_deployment(options)}"
                         + (f", {source} imported (lazy load)" if source else "")
                         + ", a group admitting TCP 988 and 1018-1023 from the cluster only; "
                         + price_line(entry))
    line = lustre_line(options, image_name)
    return lines + ([line] if line else [])


# ---- up -------------------------------------------------------------------------------------------------


def _group(aws: Aws, stamp: tags.Stamp, vpc: str, name: str, what: str, rules: Callable[[str], list[dict]],
           record: Record) -> str:
    with aws_errors(f"creating the security group of {what}"):
        gid = aws.call("create_security_group", GroupName=name, VpcId=vpc, Description=f"clustertool {what}",
                       TagSpecifications=[stamp.spec("security-group", name, clustertool__role=ROLE)])["GroupId"]
    record("security_groups", gid)
    with aws_errors(f"adding the rules of {what}'s group"):
        aws.call("authorize_security_group_ingress", GroupId=gid, IpPermissions=rules(gid))
    return gid


def nfs_rules(cluster_group: str) -> Callable[[str], list[dict]]:
    return lambda gid: [{"IpProtocol": "tcp", "FromPort": efs.NFS_PORT, "ToPort": efs.NFS_PORT,
                         "UserIdGroupPairs": [{"GroupId": cluster_group, "Description": "cluster nodes (NFS)"}]}]


def lustre_rules(cluster_group: str) -> Callable[[str], list[dict]]:
    """Lustre's ports from the cluster's nodes, and among the file system's own servers (which AWS requires)."""
    return lambda gid: [{"IpProtocol": "tcp", "FromPort": low, "ToPort": high,
                         "UserIdGroupPairs": [{"GroupId": cluster_group, "Description": "cluster nodes (Lustre)"},
                                              {"GroupId": gid, "Description": "the file system's servers"}]}
                        for low, high in fsx.PORTS]


class Maker:
    """Makes one cluster's file systems in `up`; every resource is saved the moment it exists."""

    def __init__(self, aws: Aws, cluster: ClusterRecord, stamp: tags.Stamp, record: Record,
                 save: Callable[[], None], report: Reporter):
        self.aws, self.cluster, self.stamp, self.record, self.save, self.report = (
            aws, cluster, stamp, record, save, report)
        self.entries: list[dict] = cluster.provider_state.setdefault("shared_fs", [])

    def add(self, entry: dict) -> dict:
        self.entries.append(entry)
        self.save()
        return entry

    def start(self, vpc: str, subnet: str, az: str, cluster_group: str) -> None:
        options = self.cluster.options
        for index, want in enumerate(wanted(options), 1):
            if any(e.get("index") == index for e in self.entries):
                continue  # made already (an `up` resumed)
            base = {"kind": want["kind"], "mount": want["mount"], "index": index, "dns": None, "mount_name": None,
                    "source": None, "group": None, "mount_target": None, "subnet": subnet}
            name = f"clustertool-{self.stamp.id}-{want['kind']}{index}"
            if want["kind"] == "efs":
                self._efs(base, want.get("id"), name, vpc, subnet, az, cluster_group)
            else:
                self._fsx(base, want.get("id"), name, vpc, subnet, cluster_group)

    def _efs(self, base: dict, fs_id: str | None, name: str, vpc: str, subnet: str, az: str, group: str) -> None:
        options = self.cluster.options
        if fs_id is None:
            gid = _group(self.aws, self.stamp, vpc, name, f"EFS {name}", nfs_rules(group), self.record)
            mode, mibps = throughput(options)
            made = efs.create(self.aws, efs.create_params(f"{self.stamp.id}-efs{base['index']}", self.stamp, name,
                                                          mode, mibps))
            entry = self.add({**base, "id": made["FileSystemId"], "made": True, "group": gid, "throughput": mode,
                              "mibps": mibps, "created": time.time()})
            self.report(f"shared fs: EFS {entry['id']} created; waiting until it is available")
            efs.wait_available(self.aws, entry["id"], self.report)
        else:
            entry = self.add({**base, "id": fs_id, "made": False})
            present = efs.target_in(self.aws, fs_id, subnet, az)
            if present is not None:
                groups = efs.target_groups(self.aws, present["MountTargetId"])
                self.report(f"shared fs: EFS {fs_id} has a mount target in {az} ({present['MountTargetId']}, groups "
                            f"{', '.join(groups) or 'none'}): they must admit TCP {efs.NFS_PORT} from {group}")
                return
            entry["group"] = _group(self.aws, self.stamp, vpc, name, f"EFS {fs_id}'s mount target",
                                    nfs_rules(group), self.record)
            self.save()
        target = efs.create_target(self.aws, entry["id"], subnet, entry["group"])
        entry["mount_target"] = target["MountTargetId"]
        self.save()

    def _fsx(self, base: dict, fs_id: str | None, name: str, vpc: str, subnet: str, group: str) -> None:
        options = self.cluster.options
        if fs_id is not None:
            found = fsx.existing(self.aws, fs_id)
            self.add({**base, "id": fs_id, "made": False, "subnet": (found.get("SubnetIds") or [subnet])[0]})
            self.report(f"shared fs: FSx {fs_id} attached: its security groups must admit TCP 988 and 1018-1023 "
                        f"from {group}")
            return
        gid = _group(self.aws, self.stamp, vpc, name, f"FSx {name}", lustre_rules(group), self.record)
        deployment, capacity, source = _deployment(options), _capacity(options), options.get("fsx_import")
        params = fsx.create_params(f"{self.stamp.id}-fsx{base['index']}", self.stamp, name, subnet=subnet,
                                   group=gid, capacity=capacity, deployment=deployment, import_path=source)
        made = fsx.create(self.aws, params)
        self.add({**base, "id": made["FileSystemId"], "made": True, "group": gid, "size_gib": capacity,
                  "deployment": deployment, "import": source, "association": None, "created": time.time()})
        self.report(f"shared fs: FSx for Lustre {made['FileSystemId']} ({capacity} GiB {deployment}) creating"
                    + (f", importing {source}" if source else ""))


def ready(aws: Aws, cluster: ClusterRecord, report: Reporter) -> list[dict]:
    """Wait until every file system (and EFS mount target) is available; fill in how to mount it."""
    for entry in cluster.provider_state.get("shared_fs", []):
        if entry.get("source"):
            continue
        if entry["kind"] == "efs":
            found = efs.wait_available(aws, entry["id"], report)
            target = entry.get("mount_target") or (efs.target_in(aws, entry["id"], entry.get("subnet", ""), "") or
                                                    {}).get("MountTargetId")
            if target:
                efs.wait_target(aws, entry["id"], target, report)
            entry["dns"] = efs.dns_name(entry["id"], aws.region)
            entry["source"] = f"{entry['dns']}:/"
            entry["size_bytes"] = (found.get("SizeInBytes") or {}).get("Value")
        else:
            found = fsx.wait_available(aws, entry["id"], report)
            entry["dns"], entry["mount_name"] = found.get("DNSName"), fsx.mount_name(found)
            entry["size_gib"] = found.get("StorageCapacity") or entry.get("size_gib")
            entry["deployment"] = (found.get("LustreConfiguration") or {}).get("DeploymentType")
            if entry.get("made") and entry.get("import") and entry["deployment"] == "PERSISTENT_2" \
                    and not entry.get("association"):
                entry["association"] = fsx.associate(aws, entry["id"], entry["import"])
                report(f"shared fs: {entry['import']} linked to {entry['id']} ({entry['association']}); its file "
                       "list is imported in the background, contents load on first read")
            entry["source"] = f"{entry['dns']}@tcp:/{entry['mount_name']}"
        report(f"shared fs: {entry['kind']} {entry['id']} ready for {entry['mount']}"
               + (f"; {price_line(entry)}" if entry.get("made") else " (attached)"))
    known = [monthly(e)[0] for e in cluster.provider_state.get("shared_fs", []) if e.get("made")]
    cluster.provider_state["shared_fs_hourly"] = sum(m for m in known if m) / HOURS_PER_MONTH  # for the ledger
    return cluster.provider_state.get("shared_fs", [])


def status_lines(cluster: ClusterRecord) -> dict[str, str]:
    """`status`: each file system with what it costs a month (made ones; attached ones are billed elsewhere)."""
    out = {}
    for entry in cluster.provider_state.get("shared_fs", []):
        what = f"{entry['kind']} {entry['id']} at {entry['mount']}"
        out[f"shared fs {entry['mount']}"] = (f"{what}: {price_line(entry)}{_so_far(entry)}" if entry.get("made")
                                             else f"{what}: attached (billed to its owner; down keeps it)")
    return out


def _so_far(entry: dict) -> str:
    total, _ = monthly(entry)
    if total is None or not entry.get("created"):
        return ""
    hours = max(0.0, time.time() - float(entry["created"])) / 3600.0
    return f"; so far about ${total / HOURS_PER_MONTH * hours:,.2f} over {hours:.1f} h"
