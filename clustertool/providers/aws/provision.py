"""The bodies of the provider's verbs: run, wait, finish, query, stop, start, terminate, describe."""

from __future__ import annotations

import time

from clustertool.core.errors import ProviderError
from clustertool.core.model import ClusterRecord, ClusterState, Node, Reporter, silent
from clustertool.providers.aws import (
    adopt,
    az_launch,
    capacity,
    capacity_blocks,
    capacity_wait,
    controller_iam,
    filesystems,
    filesystems_down,
    images,
    instances,
    leader,
    lease,
    network,
    owner,
    pricing,
    reservations,
    servers,
    tags,
    teardown,
    topology,
)
from clustertool.providers.aws.client import Aws, aws_errors
from clustertool.providers.aws.prepare import Prep
from clustertool.providers.base import ProvisionRequest
from clustertool.remote import access


def session_for(cluster: ClusterRecord, report: Reporter = silent) -> Aws:
    ps, opts = cluster.provider_state, cluster.options
    return Aws(region=ps.get("region") or opts.get("region"), profile=opts.get("profile"), report=report)


def run(request: ProvisionRequest, prep: Prep) -> list[Node]:
    cluster, report = request.cluster, request.report
    ps = cluster.provider_state
    ps["region"] = prep.aws.region
    request.save()
    if prep.adopting:
        return _adopt(request, prep)
    record = az_launch.recorder(cluster, request.save)
    info, aws, stamp, me = prep.info, prep.aws, prep.stamp, prep.me
    assert info is not None and stamp is not None and me is not None  # prepare sets them unless adopting
    suffix = ps.setdefault("suffix", stamp.id.rsplit("-", 1)[-1] if stamp.id else az_launch.new_suffix())
    ps["instance_type"] = info.name
    ps["slots"] = request.slots or info.gpus or 1  # before launch: a killed up's status still knows
    if prep.block is not None:  # --capacity-block: shown by status, its end watched by the leader
        capacity_blocks.record(cluster, prep.block)
    reservations.record(ps, prep.reservation, cluster.options)  # --capacity-reservation: status, $0 more
    if prep.servers is not None:
        ps["server_type"], ps["servers"] = prep.servers.info.name, prep.servers.count
    ps["owner"] = {"arn": me.arn, "home": me.home}
    request.save()
    held = lease.Lease(aws)
    aws.tick = held.beat
    image = images.resolve(aws, cluster.options.get("ami"), info.arch)
    report(f"image: {image.describe()}")
    vpc = network.vpc_for(aws, cluster.options.get("subnet"))
    cidr, source = prep.cidr or (network.vpc_cidr(aws, vpc), "the VPC's own range, where --jump's bastion is")
    behind = leader.leader_only(cluster.options)
    report(f"SSH allowed from {cidr} ({source})" + (" to the leader only" if behind else ""))
    if cidr in ("0.0.0.0/0", "::/0"):
        report("warning: SSH is open to the whole internet, as --ssh-cidr asked")
    group_id = network.create_security_group(aws, stamp, vpc, None if behind else cidr, record)
    held.hold(group_id)
    leader_group = leader.create_group(aws, stamp, vpc, cidr, record) if behind else None
    owner.check_race(aws, stamp, me)
    key_name = cluster.options.get("key_name") or network.import_key_pair(aws, stamp, request.public_key, record)
    server_image = None
    if prep.servers is not None:
        server_image = image if prep.servers.info.arch == info.arch else images.resolve(
            aws, cluster.options.get("ami"), prep.servers.info.arch)
    az, launched, server_insts = az_launch.launch_in_order(
        aws, cluster, stamp=stamp, count=request.count, info=info, image=image, azs=prep.azs, group_id=group_id,
        key_name=key_name, suffix=suffix, record=record, report=report, public_key=request.public_key,
        server_plan=prep.servers, server_image=server_image,
        waiter=capacity_wait.Waiter(capacity_wait.setting(cluster.options), ps, request.save, report, aws.tick))
    ps["az"] = az
    request.save()
    ordered = az_launch.tag_nodes(aws, cluster.name, launched)
    ordered += servers.tag(aws, cluster.name, server_insts, len(ordered))
    what = f"{request.count} x {info.name}" + (f" and {len(server_insts)} x {ps['server_type']} (servers)"
                                                if server_insts else "")
    report(f"launched {what} in {az}; hourly: {_hourly(aws, cluster, request.count)}")
    if leader_group:
        eni = leader.attach(aws, ordered[0], [group_id, leader_group])
        if leader.gets_elastic_ip(cluster.options):
            address = leader.elastic_ip(aws, stamp, eni, record)
            report(f"leader: Elastic IP {address}; members have no public address (reached through the leader)")
    if cluster.options.get("efa") and info.efa_interfaces > 1 and not leader_group:
        report(f"{info.efa_interfaces} EFA interfaces per node: AWS gives such nodes no public IP, so they are "
               "reached by private address (from inside the VPC)")
    return instances.nodes_from_tags(ordered, ps["slots"])


def shared_fs(request: ProvisionRequest, prep: Prep) -> list[dict]:
    """The hook's body: in the zone and subnet the instances got, file systems made or attached and
    waited until mountable (filesystems.py); each saved the moment it exists."""
    cluster = request.cluster
    if not filesystems.wanted(cluster.options) or prep.adopting or prep.stamp is None:
        return cluster.provider_state.get("shared_fs", [])
    ps, aws = cluster.provider_state, prep.aws
    subnet, vpc = network.subnet_for(aws, ps["az"], cluster.options.get("subnet"))
    record = az_launch.recorder(cluster, request.save)
    maker = filesystems.Maker(aws, cluster, prep.stamp, record, request.save, request.report)
    maker.start(vpc, subnet, ps["az"], ps["security_groups"][0])  # the cluster's own group is made first
    entries = filesystems.ready(aws, cluster, request.report)
    request.save()
    return entries


def _adopt(request: ProvisionRequest, prep: Prep) -> list[Node]:
    cluster = request.cluster
    found = prep.adopted
    if request.count and request.count != len(found):
        raise ProviderError(f"--nodes {request.count} but {len(found)} instance(s) matched for adoption")
    cluster.provider_state["adopted"] = [i["InstanceId"] for i in found]
    types = sorted({i.get("InstanceType", "") for i in found})
    cluster.provider_state["instance_type"] = types[0] if len(types) == 1 else ""
    slots = request.slots or _gpus(prep.aws, types) or 1
    cluster.provider_state["slots"] = slots
    if cluster.options.get("key"):
        cluster.ssh_key = cluster.options["key"]
    request.save()
    zones = sorted({i.get("Placement", {}).get("AvailabilityZone", "") for i in found})
    request.report(f"adopted {len(found)} instance(s) ({', '.join(types)}) in {', '.join(zones)}; "
                   "down will leave them running")
    if len(zones) > 1:
        request.report("warning: the adopted instances span several Availability Zones (slower, and "
                       "cross-AZ traffic is billed)")
    return adopt.to_nodes(found, cluster.options.get("leader"), slots)


def _gpus(aws: Aws, types: list[str]) -> int:
    counts = {capacity.type_info(aws, t).gpus for t in types if t}
    return counts.pop() if len(counts) == 1 else 0


def wait(cluster: ClusterRecord, aws: Aws) -> list[Node]:
    """Until running with status checks ``ok``, then (unless no_ssh) until SSH answers; host keys from
    the console output when it has them.  Ends by checking that every instance still runs."""
    ids = instances.ids_of(cluster.nodes)
    instances.wait_for_state(aws, ids, {"running"}, what="running", bad=instances.NOT_RUNNING)
    instances.wait_status_ok(aws, ids)
    nodes = instances.refresh(aws, cluster.nodes)
    for node in nodes:
        if not node.host_keys and node.instance_id:
            node.host_keys = instances.console_host_keys(aws, node.instance_id)
    if not cluster.no_ssh:
        polls = {"n": 0}

        def still_running() -> None:
            polls["n"] += 1
            if polls["n"] % 6 == 0:
                instances.check_running(aws, ids)
        direct = access.direct(cluster, nodes)  # members behind the leader: waited for from the leader
        if direct:
            instances.wait_ssh_port([n.reach_host for n in direct], port=direct[0].ssh_port, tick=still_running)
    instances.check_running(aws, ids)
    return nodes


def finish(cluster: ClusterRecord, aws: Aws) -> None:
    """`up` succeeded: the lease becomes 'done' (this fails if a sweep removed the cluster meanwhile)."""
    if cluster.provider_state.get("adopted"):
        return
    topology.retag(aws, cluster)  # nodes `up` put in topology order: their Name and index tags follow
    groups = cluster.provider_state.get("security_groups", [])  # the cluster's and (--access leader) the leader's
    lease.Lease(aws).done(groups + instances.ids_of(cluster.nodes))


def query(cluster: ClusterRecord, report: Reporter = silent) -> list[Node]:
    """Current nodes; of a cluster whose `up` did not finish, what its id tag finds in AWS (an `up`
    killed right after RunInstances has recorded no node yet, but its instances run)."""
    aws = session_for(cluster, report)
    unfinished = cluster.status in (ClusterState.PROVISIONING, ClusterState.FAILED)
    if unfinished and cluster.id and not cluster.provider_state.get("adopted"):
        found = [i for i in instances.tagged_by(aws, tags.Stamp(cluster.name, cluster.id).filter())]
        slots = cluster.provider_state.get("slots") or 1
        return instances.nodes_from_tags(found, slots)
    return instances.refresh(aws, [Node.from_dict(n.to_dict()) for n in cluster.nodes])


def _refuse_spot(cluster: ClusterRecord, verb: str) -> None:
    if cluster.options.get("spot"):
        raise ProviderError(f"cannot {verb} one-time spot instances", hint="`clustertool down` them instead")


def _move(cluster: ClusterRecord, verb: str, doing: str, target: str, report: Reporter) -> Aws:
    """stop/start every node's instance and wait until all are ``target``."""
    _refuse_spot(cluster, verb)
    aws = session_for(cluster, report)
    ids = instances.ids_of(cluster.nodes)
    with aws_errors(f"{doing} instances"):
        aws.call(f"{verb}_instances", InstanceIds=ids)
    instances.wait_for_state(aws, ids, {target}, what=target, bad={"terminated", "shutting-down"})
    return aws


def stop(cluster: ClusterRecord, report: Reporter = silent) -> None:
    _move(cluster, "stop", "stopping", "stopped", report)


def start(cluster: ClusterRecord, report: Reporter = silent) -> list[Node]:
    aws = _move(cluster, "start", "starting", "running", report)
    return instances.refresh(aws, cluster.nodes)  # public addresses change across stop/start


def set_shutdown_behavior(cluster: ClusterRecord, behavior: str, report: Reporter = silent) -> None:
    aws = session_for(cluster, report)
    for instance_id in instances.ids_of(cluster.nodes):
        with aws_errors(f"setting the shutdown behaviour of {instance_id}"):
            aws.call("modify_instance_attribute", InstanceId=instance_id,
                     InstanceInitiatedShutdownBehavior={"Value": behavior})


def confirm_owner(cluster: ClusterRecord, force: bool, verb: str, report: Reporter = silent) -> None:
    if cluster.provider_state.get("adopted"):
        return  # adopted machines carry no clustertool tags; the state is the whole story
    owner.confirm(session_for(cluster, report), cluster, force, verb)


def terminate(cluster: ClusterRecord, report: Reporter = silent) -> list[str]:
    """Everything the cluster made, found by its id tag and state; adopted instances only when asked."""
    aws = session_for(cluster, report)
    owned = teardown.owned(aws, cluster)
    lines: list[str] = []
    if owned.instances and cluster.provider_state.get("instance_type"):
        workers = len(owned.instances) - (sum(1 for n in cluster.nodes if n.is_server)
                                          or int(cluster.provider_state.get("servers") or 0))
        lines.append(reservations.stop_line(cluster.provider_state, max(workers, 0))
                     or f"stopping the bill of {_hourly(aws, cluster, max(workers, 0))}")
    controller = controller_iam.remove(aws, cluster, report)  # while its node is there to take it off
    shared, owned = filesystems_down.before_groups(aws, cluster, owned, report)  # instances, then file systems
    removed = controller + teardown.remove(aws, owned, report)
    lines += shared + removed
    adopted = cluster.provider_state.get("adopted", [])
    if adopted and not cluster.terminate_adopted:
        lines.append(f"left {len(adopted)} adopted instance(s) running: {', '.join(adopted)} "
                     "(down --terminate-adopted terminates them)")
    if not removed and not shared:
        lines.append("nothing of this cluster was left in AWS")
    return lines


def _hourly(aws: Aws | None, cluster: ClusterRecord, count: int) -> str:
    """The cluster's price per hour: ``count`` GPU nodes, plus its reduction servers."""
    ps, opts = cluster.provider_state, cluster.options
    itype, is_spot = ps.get("instance_type") or "", bool(opts.get("spot"))
    spot = pricing.spot(aws, itype, ps.get("az")) if is_spot and aws is not None else None
    sspot = (pricing.spot(aws, ps["server_type"], ps.get("az"))
             if is_spot and aws is not None and ps.get("server_type") else None)
    total, basis = servers.combine(pricing.hourly(itype, count, spot_price=spot, is_spot=is_spot),
                                   servers.hourly(cluster, is_spot, sspot))
    return reservations.hourly_text(ps, f"${total:,.2f}/h ({basis})" if total is not None else basis)


def describe(cluster: ClusterRecord) -> dict:
    """Status lines: hourly price and the cost so far since launch."""
    ps, opts = cluster.provider_state, cluster.options
    itype, count = ps.get("instance_type") or "", len([n for n in cluster.nodes if not n.is_server])
    if not itype:
        return {"hourly price": "unknown (mixed or unknown instance types)"}
    spot = sspot = None
    if opts.get("spot"):
        try:
            spot = pricing.spot(session_for(cluster), itype, ps.get("az"))
            sspot = pricing.spot(session_for(cluster), ps["server_type"], ps.get("az")) if ps.get("server_type") \
                else None
        except Exception:  # status still works without the spot price
            spot = None
    total, basis = servers.combine(pricing.hourly(itype, count, spot_price=spot, is_spot=bool(opts.get("spot"))),
                                   servers.hourly(cluster, bool(opts.get("spot")), sspot))
    hourly = f"${total:,.2f}/h ({basis})" if total is not None else basis
    since = cluster.created or time.time()
    if cluster.status == ClusterState.STOPPED:
        hourly = f"compute not billed while stopped (running: {hourly}); the EBS volumes still are"
    out = {"hourly price": hourly, "cost so far": pricing.cost_so_far(total, since)}
    out.update(reservations.status_lines(ps, out))  # --capacity-reservation: it, and $0 more
    out.update(capacity_blocks.status_lines(cluster))  # --capacity-block: prepaid, and its end
    out.update(filesystems.status_lines(cluster))  # --shared-fs: what each costs a month
    if cluster.provider_state.get("adopted"):
        out["note"] = "adopted instances: billed to you whether or not the cluster exists"
    return out
