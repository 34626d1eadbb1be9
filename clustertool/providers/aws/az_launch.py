"""Launch N instances together in one AZ: per-attempt placement group, one RunInstances call
with MinCount=MaxCount=N, and on a capacity or quota error a clean retreat to the next AZ."""

from __future__ import annotations

import secrets
from typing import Any, Callable

from clustertool.core.errors import ProviderError
from clustertool.core.model import ClusterRecord, Reporter
from clustertool.providers.aws import (
    capacity,
    capacity_blocks,
    capacity_wait,
    leader,
    network,
    placement,
    reservations,
    servers,
    tags,
    teardown,
)
from clustertool.providers.aws.client import (
    CAPACITY_CODES,
    NEXT_AZ_CODES,
    QUOTA_CODES,
    Aws,
    aws_errors,
    error_code,
    is_code,
)
from clustertool.providers.aws.images import Image

DEFAULT_IOPS = 10_000  # what the seeds provisioned for their dataset disks
IOPS_TYPES = ("io1", "io2", "gp3")


def recorder(cluster: ClusterRecord, save: Callable[[], None]) -> Callable[[str, str], None]:
    """Record a created resource in provider_state and persist at once (an interrupted up can be undone)."""
    def record(kind: str, rid: str) -> None:
        items = cluster.provider_state.setdefault(kind, [])
        if rid not in items:
            items.append(rid)
        save()
    return record


def unrecord(cluster: ClusterRecord, kind: str, rid: str) -> None:
    items = cluster.provider_state.get(kind, [])
    if rid in items:
        items.remove(rid)


def new_suffix() -> str:
    return secrets.token_hex(3)


def volume(options: dict) -> dict[str, Any]:
    """The root EBS volume: size/type/IOPS from options (defaults 200 GB gp3 at 10,000 IOPS)."""
    vtype = options.get("volume_type") or "gp3"
    ebs: dict[str, Any] = {"VolumeSize": int(options.get("volume_size") or 200), "VolumeType": vtype,
                           "DeleteOnTermination": True}
    if vtype in IOPS_TYPES:
        ebs["Iops"] = int(options.get("iops") or DEFAULT_IOPS)
    return ebs


# `up --scheduler slurm`: what every node installs at its first boot (Debian's and Ubuntu's package names);
# munge and the Slurm daemons stay stopped until clustertool's setup writes the cluster's key and config over
# SSH (the key never rides in user data, which the instance's metadata service shows to any process there)
SLURM_PACKAGES = ("munge", "slurmd", "slurmctld", "slurm-client")
SLURM_UNITS = ("munge", "slurmd", "slurmctld")


def user_data(public_key: str, slurm: bool = False) -> str:
    """cloud-init config: the cluster's public key for the image's default user (when given), and with
    ``slurm`` the Slurm packages, their units stopped and disabled until the setup enables them."""
    lines = ["#cloud-config"]
    if public_key.strip():
        lines += ["ssh_authorized_keys:", f"  - {public_key.strip()}"]
    if slurm:
        lines += ["package_update: true", "packages:", *[f"  - {p}" for p in SLURM_PACKAGES],
                  "runcmd:", f"  - [systemctl, disable, --now, {', '.join(SLURM_UNITS)}]"]
    return "\n".join(lines) + "\n"


def wants_slurm(cluster: ClusterRecord) -> bool:
    """`up --scheduler slurm` made this cluster (not an adopted Slurm, whose machines are the site's)."""
    scheduler = cluster.scheduler or {}
    return scheduler.get("kind") == "slurm" and scheduler.get("made", True)


def interfaces(subnet: str, group_id: str, efa: int, public_ip: bool = True) -> list[dict[str, Any]]:
    """The network interfaces of each node: one plain interface, with a public IP only when
    ``public_ip`` (--access all); or, with --efa, one EFA interface per network card (card 0 at
    device 0, every other card at device 1).  AWS gives no public IP at launch to an instance with
    several interfaces (and refuses the request if asked to), so then no interface asks for one."""
    if efa <= 1:
        iface: dict[str, Any] = {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [group_id],
                                 "AssociatePublicIpAddress": public_ip, "DeleteOnTermination": True}
        if efa == 1:
            iface["InterfaceType"] = "efa"
        return [iface]
    return [{"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "SubnetId": subnet,
             "Groups": [group_id], "InterfaceType": "efa", "DeleteOnTermination": True} for card in range(efa)]


def shutdown_behavior(options: dict, autostop: dict | None = None) -> str:
    """terminate for autodown (and for one-time spot, which cannot stop), else stop."""
    return "terminate" if (autostop or {}).get("down") or options.get("spot") else "stop"


def launch_params(*, stamp: tags.Stamp, count: int, instance_type: str, image: Image, subnet: str,
                  group_id: str, key_name: str, az: str, placement_group: str | None,
                  options: dict, token: str, public_key: str = "", efa_interfaces: int = 0,
                  autostop: dict | None = None, slurm: bool = False) -> dict[str, Any]:
    """The one RunInstances request of an attempt (pure: unit-tested)."""
    efa = (efa_interfaces or 1) if options.get("efa") else 0
    where: dict[str, Any] = {"AvailabilityZone": az}
    if placement_group:
        where["GroupName"] = placement_group
    params: dict[str, Any] = {
        "ImageId": image.id, "InstanceType": instance_type, "MinCount": count, "MaxCount": count,
        "KeyName": key_name, "NetworkInterfaces": interfaces(subnet, group_id, efa, leader.wants_public_ip(options)),
        "Placement": where,
        "BlockDeviceMappings": [{"DeviceName": image.root_device, "Ebs": volume(options)}],
        "TagSpecifications": [stamp.spec("instance", **{"clustertool__role": "member"}),
                              stamp.spec("volume"), stamp.spec("network-interface")],
        "ClientToken": token[:64],
        # what an OS power-off does: the autostop watcher powers nodes off from inside (no credentials)
        "InstanceInitiatedShutdownBehavior": shutdown_behavior(options, autostop),
    }
    key = public_key if options.get("key_name") else ""  # the cluster key works beside the user's key pair
    if key.strip() or slurm:
        params["UserData"] = user_data(key, slurm)
    if options.get("spot"):
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    params.update(capacity_blocks.launch_fields(options))  # --capacity-block: its market and reservation
    params.update(reservations.launch_fields(options))  # --capacity-reservation(-group), --reservations
    return params


def launch_in_order(aws: Aws, cluster: ClusterRecord, *, stamp: tags.Stamp, count: int, info: capacity.TypeInfo,
                    image: Image, azs: list[str], group_id: str, key_name: str, suffix: str,
                    record: Callable[[str, str], None], report: Reporter, public_key: str = "",
                    server_plan: servers.ServerPlan | None = None,
                    server_image: Image | None = None,
                    waiter: capacity_wait.Waiter | None = None) -> tuple[str, list[dict], list[dict]]:
    """Try each AZ in order; return (az, instances, server instances) of the first that launches all N
    (and all K reduction servers, by a second RunInstances in the same subnet and placement group).
    With a ``waiter`` (--retry-until-up), a round in which no zone had capacity is followed, after the
    interval, by another round over every zone, until one launches or --retry-for has passed."""
    waiter = waiter or capacity_wait.Waiter(None, cluster.provider_state, lambda: None, report)
    while True:
        attempt = waiter.begin()
        tried: list[tuple[str, str]] = []
        codes: dict[str, str] = {}  # zone -> the error code of its attempt
        found = _one_round(aws, cluster, stamp=stamp, count=count, info=info, image=image, azs=azs,
                           group_id=group_id, key_name=key_name, suffix=suffix if attempt == 1 else
                           f"{suffix}r{attempt}", token_tail="" if attempt == 1 else f"-r{attempt}",
                           record=record, report=report, public_key=public_key, server_plan=server_plan,
                           server_image=server_image, tried=tried, codes=codes)
        if found is not None:
            waiter.succeeded()
            return found
        short = [az for az, code in codes.items() if code in CAPACITY_CODES]  # zones without capacity
        retryable = bool(short) and not set(codes.values()) & QUOTA_CODES
        waiter.after_failure(capacity.launch_failure(tried, count, info.name), short, info.name, retryable)


def _one_round(aws: Aws, cluster: ClusterRecord, *, stamp: tags.Stamp, count: int, info: capacity.TypeInfo,
               image: Image, azs: list[str], group_id: str, key_name: str, suffix: str, token_tail: str,
               record: Callable[[str, str], None], report: Reporter, public_key: str,
               server_plan: servers.ServerPlan | None, server_image: Image | None,
               tried: list[tuple[str, str]], codes: dict[str, str]) -> tuple[str, list[dict], list[dict]] | None:
    """One attempt in each AZ in turn; None when none launched (``tried``/``codes``: why, per zone)."""
    from botocore.exceptions import ClientError

    for az in azs:
        try:
            subnet, _ = network.subnet_for(aws, az, cluster.options.get("subnet"))
        except ProviderError as exc:
            tried.append((az, exc.message))
            continue
        # a capacity block's instances are placed together by EC2: no placement group of ours
        # a named capacity reservation: its own placement group, if it is in one (launches must match it)
        ours = None if capacity_blocks.uses_block(cluster.options) or reservations.named(cluster.options) else \
            placement.create(aws, stamp, az, suffix, record, report)
        group = ours or reservations.placement_group(cluster.provider_state)
        params = launch_params(stamp=stamp, count=count, instance_type=info.name, image=image,
                               subnet=subnet, group_id=group_id, key_name=key_name, az=az,
                               placement_group=group, options=cluster.options,
                               token=f"{stamp.id}-{az}{token_tail}", public_key=public_key,
                               efa_interfaces=info.efa_interfaces,
                               autostop=cluster.autostop, slurm=wants_slurm(cluster))
        report(f"{az}: launching {count} x {info.name}" + (f" in placement group {group}" if group else ""))
        server_insts: list[dict] = []
        try:
            instances = aws.call("run_instances", **params)["Instances"]
            for inst in instances:
                record("instances", inst["InstanceId"])
            if server_plan is not None:
                sparams = launch_params(stamp=stamp, count=server_plan.count, instance_type=server_plan.info.name,
                                        image=server_image or image, subnet=subnet, group_id=group_id,
                                        key_name=key_name, az=az, placement_group=group,
                                        options=servers.launch_options(cluster.options),
                                        token=f"{stamp.id}-{az}-servers{token_tail}",
                                        public_key=public_key, autostop=cluster.autostop)
                sparams["TagSpecifications"][0] = stamp.spec("instance", **{"clustertool__role": "server"})
                report(f"{az}: launching {server_plan.count} x {server_plan.info.name} (reduction servers) "
                       "beside them")
                server_insts = aws.call("run_instances", **sparams)["Instances"]
                for inst in server_insts:
                    record("instances", inst["InstanceId"])
        except ClientError as exc:
            if not is_code(exc, *NEXT_AZ_CODES):
                with aws_errors(f"launching {count} x {info.name} in {az}"):
                    raise
            why = capacity.reason(exc)
            tried.append((az, why))
            codes[az] = error_code(exc)
            report(f"{az}: {why}; removing this attempt's resources")
            teardown.clean_attempt(aws, cluster, az, ours, report)
            if ours:
                unrecord(cluster, "placement_groups", ours)
            continue
        return az, instances, server_insts
    return None



def tag_nodes(aws: Aws, cluster: str, instances: list[dict]) -> list[dict]:
    """Give each launched instance its role, index and Name; leader = launch index 0."""
    ordered = sorted(instances, key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))
    for k, inst in enumerate(ordered, start=1):
        first = k == 1
        values = {tags.ROLE: "leader" if first else "member", tags.NODE: str(k),
                  tags.NAME: tags.node_name(cluster, k, first)}
        with aws_errors("tagging instances"):
            aws.call("create_tags", Resources=[inst["InstanceId"]], Tags=tags.pairs(values))
        inst["Tags"] = [t for t in inst.get("Tags", []) if t["Key"] not in values] + tags.pairs(values)
    return ordered
