"""Before anything is made: validate options, open the session, learn the type and the AZ
order, find the SSH source, learn who the caller is (the owner), check the name is not another
owner's and the quota holds the request; and the --dry-run plan (EC2 DryRun calls, nothing created)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.core.errors import ToolError, UsageError
from clustertool.providers.aws import (
    adopt,
    capacity,
    capacity_blocks,
    capacity_wait,
    filesystems,
    images,
    leader,
    network,
    owner,
    pricing,
    quota,
    reservations,
    servers,
    tags,
)
from clustertool.providers.aws.az_launch import launch_params, volume, wants_slurm
from clustertool.providers.aws.client import Aws, error_code, error_message
from clustertool.providers.base import ProvisionRequest
from clustertool.remote import access

IOPS_RANGE = {"gp3": (3000, 16000), "io1": (100, 64000), "io2": (100, 256000)}


@dataclass
class Prep:
    aws: Aws
    adopting: bool = False
    info: capacity.TypeInfo | None = None
    azs: list[str] = field(default_factory=list)
    cidr: tuple[str, str] | None = None
    adopted: list[dict] = field(default_factory=list)
    me: owner.Owner | None = None  # the caller: the owner of what this up makes
    stamp: tags.Stamp | None = None
    limits: quota.Quota | None = None
    servers: servers.ServerPlan | None = None  # --reduction-servers K: their type and quota
    block: capacity_blocks.Reservation | None = None  # --capacity-block: the reservation, checked
    reservation: reservations.Target | None = None  # --capacity-reservation: the ODCR, checked


def validate(options: dict, count: int | None) -> None:
    """Offline checks of the options; each failure is one line naming the flag."""
    adopting = bool(options.get("adopt_tag") or options.get("adopt_ids"))
    capacity_wait.setting(options)  # --retry-until-up and its durations
    capacity_blocks.validate(options)  # --capacity-block, --wait, --block-end-warning/-signal
    reservations.validate(options)  # --capacity-reservation(-group), --reservations
    if options.get("adopt_tag") and options.get("adopt_ids"):
        raise UsageError("--adopt-tag and --adopt-ids: give one of them, not both")
    filesystems.validate(options)  # --shared-fs kinds, --efs-throughput, --fsx-*
    if adopting and filesystems.wanted(options):
        raise UsageError("--shared-fs goes with launched clusters, not adopted machines",
                         hint="mount the file system on the adopted machines yourself, or launch with --instance-type")
    if adopting:
        if options.get("adopt_tag"):
            adopt.parse_tag(options["adopt_tag"])
        else:
            adopt.parse_ids(options["adopt_ids"])
        if options.get("instance_type"):
            raise UsageError("--instance-type does not apply when adopting existing instances")
        return
    if not options.get("instance_type") and not options.get("capacity_block"):  # a block knows its type
        raise UsageError("--instance-type is required for provider 'aws'", hint="e.g. --instance-type p4d.24xlarge")
    if options.get("instance_type"):
        capacity.check_type_name(options["instance_type"])
    if not count:
        raise UsageError("--nodes is required for provider 'aws' (unless adopting)", hint="e.g. --nodes 4")
    size = int(options.get("volume_size") or 200)
    if not 8 <= size <= 16384:
        raise UsageError(f"--volume-size: expected 8-16384 (GB), got {size}")
    vtype, iops = options.get("volume_type") or "gp3", options.get("iops")
    if iops is not None:
        if vtype not in IOPS_RANGE:
            raise UsageError(f"--iops: volume type {vtype} takes no provisioned IOPS", hint="use gp3, io1 or io2")
        low, high = IOPS_RANGE[vtype]
        if not low <= int(iops) <= high:
            raise UsageError(f"--iops: {vtype} takes {low}-{high} IOPS, got {iops}")
    if options.get("ssh_cidr"):
        network.parse_cidr(options["ssh_cidr"])
    access.check_mode(options.get("access") or "leader")
    if options.get("jump"):
        access.parse_jump(options["jump"])


def prepare(request: ProvisionRequest) -> Prep:
    options = request.cluster.options
    validate(options, request.count)
    aws = Aws(region=options.get("region"), profile=options.get("profile"), report=request.report)
    if options.get("adopt_tag") or options.get("adopt_ids"):
        found = adopt.find(aws, options)
        if servers.count(options):
            raise UsageError("--reduction-servers launches new instances: it does not go with adopting",
                             hint="adopt the GPU nodes, or launch the cluster with --instance-type")
        adopt.to_nodes(found, options.get("leader"), 1)  # --leader must name one of them
        return Prep(aws=aws, adopting=True, adopted=found)
    block = capacity_blocks.prepare(aws, options, request.count) if options.get("capacity_block") else None
    info = capacity.type_info(aws, options["instance_type"])
    if options.get("efa"):
        capacity.check_efa(info)
    az = options.get("az")
    if options.get("subnet"):
        subnet_zone = network.subnet_az(aws, options["subnet"])
        if az and az != subnet_zone:
            raise UsageError(f"--subnet {options['subnet']} is in {subnet_zone}, not --az {az}")
        az = subnet_zone
    if block is not None:
        az = capacity_blocks.zone(block, az)
    target = reservations.prepare(aws, options, request.count, info.name)  # checked before anything is made
    if target is not None:
        az = reservations.zone(target, az)
    azs = capacity.az_order(aws, info.name, az)
    server_plan, azs = servers.prepare(aws, options, azs)
    # behind a --jump bastion the SSH source is the VPC's own range (found at launch) unless given
    cidr = None if options.get("jump") and not options.get("ssh_cidr") else network.ssh_cidr(options.get("ssh_cidr"))
    if options.get("key_name"):
        network.check_key_name(aws, options["key_name"])
    for note in filesystems.check(aws, options):  # attached file systems exist; before anything is made
        request.report(note)
    if not request.dry_run and filesystems.wanted(options):
        lustre = filesystems.lustre_line(options, images.resolve(aws, options.get("ami"), info.arch).name)
        if lustre:
            request.report(lustre)
    me = owner.caller(aws)
    owner.check_name_free(aws, request.cluster.name, me, request.report)
    held = None if options.get("skip_quota_check") else quota.check(aws, info, request.count, bool(options.get("spot")))
    if block is not None and not request.dry_run:  # last: every other check came before a long wait
        block = capacity_blocks.started(aws, block, options, request.count, request.report)
    return Prep(aws=aws, info=info, azs=azs, cidr=cidr, me=me, stamp=owner.stamp_for(request.cluster, me),
                limits=held, servers=server_plan, block=block, reservation=target)


def network_line(info: capacity.TypeInfo, options: dict) -> str:
    public = ("public IP for SSH" if leader.wants_public_ip(options) else
              "no public IP at launch" + (" (the leader's Elastic IP comes after)" if leader.gets_elastic_ip(options)
                                          else ""))
    if not options.get("efa"):
        return public
    cards = info.efa_interfaces
    if cards <= 1:
        return f"1 EFA interface per node, {public}"
    reach = ("the leader through its Elastic IP, members through the leader" if leader.gets_elastic_ip(options)
             else "nodes are reached by private address, i.e. from inside the VPC")
    return (f"{cards} EFA interfaces per node (one per network card); no public IP at launch (AWS assigns none "
            f"with several interfaces): {reach}")


def _cidr(prep: Prep) -> str:
    return prep.cidr[0] if prep.cidr else "the VPC's own range (--jump)"


def hourly_line(prep: Prep, options: dict, count: int) -> str:
    is_spot, az = bool(options.get("spot")), prep.azs[0] if prep.azs else None
    assert prep.info is not None  # a launch's prep (prepare sets it unless adopting)
    spot = pricing.spot(prep.aws, prep.info.name, az) if is_spot else None
    total, basis = pricing.hourly(prep.info.name, count, spot_price=spot, is_spot=is_spot)
    if prep.servers is not None:
        sinfo, k = prep.servers.info, prep.servers.count
        sspot = pricing.spot(prep.aws, sinfo.name, az) if is_spot else None
        total, basis = servers.combine((total, basis), pricing.hourly(sinfo.name, k, spot_price=sspot, is_spot=is_spot))
    return f"${total:,.2f}/h ({basis})" if total is not None else basis


def plan_lines(prep: Prep, request: ProvisionRequest) -> list[str]:
    options, name = request.cluster.options, request.cluster.name
    if prep.adopting:
        nodes = adopt.to_nodes(prep.adopted, options.get("leader"), request.slots or 1)
        return [f"adopt {len(nodes)} existing instance(s) in {prep.aws.region} as cluster {name}:"] + [
            f"  {n.name} ({n.role}): {n.extra['label']} {n.instance_id} {n.address}" for n in nodes] + [
            "nothing is created; `down` leaves these instances running (unless --terminate-adopted)"]
    info, count = prep.info, request.count
    assert info is not None  # prepare sets it unless adopting
    image = images.resolve(prep.aws, options.get("ami"), info.arch)
    vol = volume(options)
    gpus = f"{info.gpus} x {info.gpu_name} GPU(s)" if info.gpus else "no GPUs"
    lines = [
        f"cluster {name}: {count} x {info.name} ({gpus}; EFA {'supported' if info.efa else 'not supported'}), "
        f"{'spot' if options.get('spot') else 'on-demand'}, region {prep.aws.region}",
        f"Availability Zones to try, in order: {', '.join(prep.azs)} "
        f"(all {count} in one RunInstances call per zone, MinCount=MaxCount={count})",
        f"placement group: a new 'cluster' strategy group per attempt, named clustertool-{name}-<az>-<suffix>",
        f"image: {image.describe()}",
        f"root volume per node: {vol['VolumeSize']} GB {vol['VolumeType']}"
        + (f", {vol['Iops']} IOPS" if "Iops" in vol else "") + ", deleted on termination",
        f"network: {('subnet ' + options['subnet']) if options.get('subnet') else 'default VPC subnet of the zone'}"
        f", {network_line(info, options)}",
        f"security group (new, clustertool-{name}-<suffix>):",
        *[f"  {rule}" for rule in network.describe_rules(None if leader.leader_only(options) else _cidr(prep))],
        *([f"  (SSH source from {prep.cidr[1]})"] if prep.cidr and not leader.leader_only(options) else []),
        *leader.plan_lines(options, prep.cidr, name),
        "key pair: " + (f"existing {options['key_name']}" if options.get("key_name")
                        else f"import the cluster key as clustertool-{name}-<suffix>"),
        f"identity: id {request.cluster.id or name + '-<suffix>'}, owner "
        f"{owner.describe(prep.me.arn, prep.me.home) if prep.me else '?'}",
        f"tags: clustertool:cluster={name}, clustertool:id, clustertool:owner, clustertool:home, clustertool:lease, "
        f"clustertool:role, clustertool:node, Name={name}-leader / {name}-node-K",
        "quota: " + (prep.limits.describe() if prep.limits else "not checked"
                     + (" (--skip-quota-check)" if options.get("skip_quota_check") else " (nothing could say)")),
        *servers.plan_lines(prep.servers, options),
        f"hourly cost: {hourly_line(prep, options, count)}",
    ]
    lines[-1:-1] = filesystems.plan_lines(options, name, image.name)  # --shared-fs: what is made, its $/month
    if prep.block is not None:  # the block's lines, and its zone instead of the zone order
        lines[1:2] = capacity_blocks.plan_lines(prep.block, options)
        lines[-1] = f"hourly cost: {capacity_blocks.prepaid_line(prep.block)}"
    elif prep.reservation is not None:  # the reservation's lines instead of the zone order and our placement group
        lines[1:3] = reservations.plan_lines(prep.reservation, options)
    else:
        lines[2:2] = reservations.plan_lines(None, options)
    if reservations.prepaid(options):
        prepaid = {"prepaid": reservations.prepaid(options)}
        lines[-1] = f"hourly cost: {reservations.hourly_text(prepaid, hourly_line(prep, options, count))}"
    retry = capacity_wait.setting(options)
    if retry is not None:
        lines.insert(2, capacity_wait.plan_line(retry))
    lines += dry_run_checks(prep, request, image)
    lines.append("dry run: nothing was created")
    return lines


def dry_run_checks(prep: Prep, request: ProvisionRequest, image: images.Image) -> list[str]:
    """EC2 DryRun=True calls: DryRunOperation means the real call would succeed."""
    aws, options, info, az = prep.aws, request.cluster.options, prep.info, prep.azs[0]
    assert info is not None  # a launch's prep (plan_lines)
    try:
        subnet, vpc = network.subnet_for(aws, az, options.get("subnet"))
    except Exception as exc:  # a ToolError: report, do not stop the plan
        return [f"dry run: no subnet in {az}: {getattr(exc, 'message', exc)}"]
    params = launch_params(stamp=prep.stamp or tags.Stamp(request.cluster.name), count=request.count,
                           instance_type=info.name, image=image, subnet=subnet, group_id="", key_name="", az=az,
                           placement_group=None, options=options, token="dry-run", efa_interfaces=info.efa_interfaces,
                           autostop=request.cluster.autostop, slurm=wants_slurm(request.cluster))
    for iface in params["NetworkInterfaces"]:
        iface.pop("Groups")
    params.pop("KeyName")
    params.pop("ClientToken")
    checks = [
        (f"RunInstances of {request.count} x {info.name} in {az}", "run_instances", params),
        ("CreateSecurityGroup", "create_security_group",
         {"GroupName": f"clustertool-{request.cluster.name}-dryrun", "Description": "dry run", "VpcId": vpc}),
        ("CreatePlacementGroup", "create_placement_group",
         {"GroupName": f"clustertool-{request.cluster.name}-dryrun", "Strategy": "cluster"}),
    ]
    return [f"dry run: {label}: {_dry(aws, op, kwargs)}" for label, op, kwargs in checks]


def _dry(aws: Aws, op: str, kwargs: dict) -> str:
    from botocore.exceptions import ClientError

    try:
        aws.call(op, DryRun=True, **kwargs)
    except ClientError as exc:
        if error_code(exc) == "DryRunOperation":
            return "would succeed"
        return f"would fail: {error_code(exc)}: {error_message(exc)}"
    except ToolError as exc:  # e.g. an endpoint that lacks the API
        return f"could not check: {exc.message}"
    return "checked (the endpoint ignored DryRun and answered)"
