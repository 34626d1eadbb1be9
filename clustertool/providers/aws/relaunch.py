"""`replace NODE` on AWS: one new instance takes the node's name, index, role and slots.

The new instance is launched by one RunInstances in the node's own zone, subnet, placement group
and security groups, with its type, image, key pair, root volume (the cluster's recorded volume
options), EFA interfaces, spot setting and shutdown behaviour, tagged like the old one (the
cluster's id, owner and home; role, node number and ``Name``).  What it copies is read from the
old instance (DescribeInstances; its shutdown behaviour from DescribeInstanceAttribute); when the
old one is gone (a spot reclaim, say) from a live sibling and the recorded state.

All or nothing, the way `up` is: the new instance id is recorded in the state (and saved) the
moment RunInstances answers, so a killed `replace` is undone by `down` (and by the next
`replace`); until the new instance runs with both status checks passed (and, for the leader, holds
the cluster's Elastic IP) any error or signal terminates it and leaves the old node as it was.
After that the new node is in the record, and the old instance is terminated, or with
``--keep-old`` stopped and tagged ``clustertool:replaced-by=<new id>`` (``status`` lists it,
``down`` removes it, ``down --sweep`` counts it): inside ``interrupts.deferred`` so a SIGTERM lets
the call in progress finish.  SSH wiring (host keys, known_hosts, hostfiles) is the generic part,
``cluster/replace.py``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Callable

from clustertool.core import interrupts, state
from clustertool.core.errors import NotSupported, ProviderError, ToolError, UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent
from clustertool.providers.aws import (
    az_launch,
    capacity,
    instances,
    leader,
    network,
    provision,
    servers,
    tags,
    teardown,
)
from clustertool.providers.aws.client import CAPACITY_CODES, NEXT_AZ_CODES, Aws, aws_errors, is_code
from clustertool.providers.aws.images import Image
from clustertool.remote import access

REPLACED_BY = "clustertool:replaced-by"  # on a kept old instance: the instance that took its place
REPLACES = "clustertool:replaces"  # on the new instance: the one it replaced
REPLACED_ROLE = "replaced"  # the role tag of a kept old instance (no node of the cluster any more)
KEPT = "replaced_kept"  # provider_state: [{node, instance, by, at}] of old instances --keep-old kept
PENDING = "replacing"  # provider_state: the replacement in flight {node, new, old, address}
IDENTITY = (tags.CLUSTER, tags.ID, tags.OWNER, tags.HOME, tags.LEASE, tags.CREATED)
NODE_TAGS = (tags.ROLE, tags.NODE, tags.NAME, instances.SERVER_TAG, REPLACED_BY, REPLACES)


def replace_node(cluster: ClusterRecord, name: str, keep_old: bool = False, report: Reporter = silent,
                 save: Callable[[], None] = lambda: None) -> Node:
    """A new instance for node ``name``; the old one is terminated (``keep_old``: stopped and tagged)."""
    node = cluster.node(name)
    _refuse(cluster, node, keep_old)
    aws = provision.session_for(cluster, report)
    try:
        clear_leftover(aws, cluster, report, save)
        old = _describe_one(aws, node.instance_id)
        template = old if old is not None and _usable(old) else _sibling(aws, cluster, node)
        params = launch_request(aws, cluster, node, template, template is old)
    except interrupts.Terminated as exc:
        raise _stopped(exc, f"before it made anything; {name} is unchanged") from None
    az = params["Placement"]["AvailabilityZone"]
    report(f"{name}: launching a new {params['InstanceType']} in {az}"
           + (f" (placement group {params['Placement']['GroupName']})" if params["Placement"].get("GroupName") else ""))
    cluster.provider_state[PENDING] = {"node": name, "old": node.instance_id, "token": params["ClientToken"]}
    save()
    new_id, moved = "", False
    try:
        new_id = _launch(aws, cluster, node, params, save)
        report(f"{name}: {new_id} launched; waiting for it to run and pass both status checks")
        instances.wait_for_state(aws, [new_id], {"running"}, what="running", bad=instances.NOT_RUNNING)
        instances.wait_status_ok(aws, [new_id])
        moved = _move_address(aws, cluster, node, new_id, report, save)
        new = _new_node(aws, node, new_id)
        if not cluster.no_ssh and access.direct(cluster, [new]):
            instances.wait_ssh_port([new.reach_host], port=new.ssh_port)
    except BaseException as exc:
        gone = _undo(aws, cluster, new_id, old, moved, report, save)
        if isinstance(exc, interrupts.Terminated):
            raise _stopped(exc, f": {'; '.join(gone + [''])}{name} is unchanged") from None
        raise
    _commit(cluster, node, new, save)
    try:
        _retire(aws, cluster, node, old, new_id, keep_old, report, save)
    except interrupts.Terminated as exc:
        raise _stopped(exc, f"after {new_id} took {name}'s place, while the old instance {node.instance_id} was "
                            f"being {'stopped' if keep_old else 'terminated'} (`down` removes it if it is left)",
                       hint=None) from None
    return new


def _stopped(exc: interrupts.Terminated, what: str, hint: str | None = "run `clustertool replace` again"
             ) -> interrupts.Terminated:
    return interrupts.Terminated(exc.signum, f"replace stopped by {interrupts.signal_name(exc.signum)}"
                                             f"{'' if what.startswith(':') else ' '}{what}",
                                 hint=hint)


def _refuse(cluster: ClusterRecord, node: Node, keep_old: bool) -> None:
    """What is refused before anything is touched."""
    if cluster.provider_state.get("adopted"):
        raise NotSupported(f"cluster {cluster.name!r} is made of adopted instances: clustertool cannot replace them",
                           hint=f"`clustertool cordon {node.name}` keeps a bad one out of hostfiles and jobs")
    if keep_old and cluster.options.get("spot"):
        raise UsageError("--keep-old: one-time spot instances cannot be stopped, so the old one cannot be kept",
                         hint=f"replace {node.name} without --keep-old (the old instance is terminated)")


def clear_leftover(aws: Aws, cluster: ClusterRecord, report: Reporter, save: Callable[[], None]) -> None:
    """A `replace` killed before it finished left a new instance no node holds: terminate it."""
    pending = cluster.provider_state.get(PENDING)
    if not pending:
        return
    for iid in _launched(aws, cluster, pending):
        report(f"removing {iid}, left by a `replace {pending.get('node')}` that did not finish")
        teardown.terminate_and_wait(aws, [iid], report)
        az_launch.unrecord(cluster, "instances", iid)
    cluster.provider_state.pop(PENDING, None)
    save()


def _launched(aws: Aws, cluster: ClusterRecord, pending: dict) -> list[str]:
    """The instances a replacement launched (its recorded id, or, when a signal cut RunInstances' answer
    off, the ones with its client token) that no node holds."""
    held = {n.instance_id for n in cluster.nodes}
    found = [pending["new"]] if pending.get("new") else []
    if pending.get("token") and pending.get("old"):
        flt = tags.Stamp(cluster.name, cluster.id).filter() + [{"Name": f"tag:{REPLACES}", "Values": [pending["old"]]}]
        found += [i["InstanceId"] for i in instances.tagged_by(aws, flt) if i.get("ClientToken") == pending["token"]]
    if not found:
        return []
    live = {i["InstanceId"] for i in instances.describe(aws, found) if instances.state_of(i) != "terminated"}
    return [iid for iid in dict.fromkeys(found) if iid in live and iid not in held]


def _describe_one(aws: Aws, instance_id: str | None) -> dict | None:
    found = instances.describe(aws, [instance_id]) if instance_id else []
    return found[0] if found else None


def _usable(inst: dict | None) -> bool:
    """Whether the old instance still says where it ran (a terminated one has lost its interfaces)."""
    if not inst or instances.state_of(inst) in ("terminated", "shutting-down"):
        return False
    return bool(_primary(inst).get("SubnetId") or inst.get("SubnetId"))


def _sibling(aws: Aws, cluster: ClusterRecord, node: Node) -> dict:
    """A live instance of another node, to copy type, image, zone, subnet and key from."""
    others = [n.instance_id for n in cluster.nodes if n.name != node.name and n.instance_id
              and n.is_server == node.is_server]
    for inst in instances.describe(aws, others):
        if _usable(inst):
            return inst
    raise ProviderError(f"cannot replace {node.name}: neither its old instance ({node.instance_id}) nor any other "
                        f"node of {cluster.name!r} is there to copy its type, image and network from",
                        hint=f"`clustertool down -c {cluster.name}` and `up` again")


def _primary(inst: dict) -> dict:
    for eni in inst.get("NetworkInterfaces") or []:
        att = eni.get("Attachment") or {}
        if att.get("DeviceIndex", 0) == 0 and att.get("NetworkCardIndex", 0) == 0:
            return eni
    return {}


def launch_request(aws: Aws, cluster: ClusterRecord, node: Node, template: dict, is_old: bool) -> dict[str, Any]:
    """The one RunInstances request (``up``'s shape, :func:`az_launch.launch_params`, with what the
    node's instance had)."""
    ps, options = cluster.provider_state, cluster.options
    az = str(template.get("Placement", {}).get("AvailabilityZone") or ps.get("az") or "")
    subnet = template.get("SubnetId") or _primary(template).get("SubnetId") \
        or network.subnet_for(aws, az, options.get("subnet"))[0]
    values = _instance_tags(cluster, node, template)
    stamp = tags.Stamp(cluster.name, *(values.get(k, "") for k in IDENTITY[1:]))
    itype = template["InstanceType"]
    efa = capacity.type_info(aws, itype).efa_interfaces if options.get("efa") and not node.is_server else 0
    image = Image(template["ImageId"], "", template.get("RootDeviceName") or "/dev/sda1", "the replaced node's")
    params = az_launch.launch_params(
        stamp=stamp, count=1, instance_type=itype, image=image, subnet=subnet, group_id="",
        key_name=template.get("KeyName") or options.get("key_name") or (ps.get("key_pairs") or [""])[0], az=az,
        placement_group=_placement_group(cluster, template, az), options=_options_of(cluster, node),
        token=f"rp-{secrets.token_hex(6)}-{node.name}-{cluster.id or cluster.name}", public_key=_public_key(cluster),
        efa_interfaces=efa, autostop=cluster.autostop, slurm=az_launch.wants_slurm(cluster) and not node.is_server)
    groups = _groups(cluster, node, template, is_old)
    for iface in params["NetworkInterfaces"]:
        iface["Groups"] = groups
    params["TagSpecifications"][0] = {"ResourceType": "instance", "Tags": tags.pairs(values)}
    params["InstanceInitiatedShutdownBehavior"] = _shutdown_behaviour(aws, cluster, template)
    return params


def _options_of(cluster: ClusterRecord, node: Node) -> dict:
    if node.is_server:
        return servers.launch_options(cluster.options)
    return cluster.options


def _instance_tags(cluster: ClusterRecord, node: Node, template: dict) -> dict[str, str]:
    """The template's tags (identity, the user's own), with this node's role, number and Name."""
    values = {k: v for k, v in tags.as_dict(template.get("Tags")).items()
              if not k.startswith("aws:") and k not in NODE_TAGS}
    values[tags.CLUSTER] = cluster.name
    if cluster.id:
        values[tags.ID] = cluster.id
    values[tags.ROLE], values[tags.NODE] = node.role, str(node.index)
    if node.is_server:
        number = node.name.rsplit("-", 1)[1]
        values[instances.SERVER_TAG], values[tags.NAME] = number, f"{cluster.name}-server-{number}"
    else:
        values[tags.NAME] = tags.node_name(cluster.name, node.index, node.is_leader)
    if node.instance_id:
        values[REPLACES] = node.instance_id
    return values


def _placement_group(cluster: ClusterRecord, template: dict, az: str) -> str | None:
    """The instance's group, else the one `up` recorded for the zone (moto leaves GroupName empty)."""
    found = template.get("Placement", {}).get("GroupName")
    if found:
        return found
    groups = [g for g in cluster.provider_state.get("placement_groups", []) if f"-{az}-" in g]
    return groups[-1] if groups else None


def _groups(cluster: ClusterRecord, node: Node, template: dict, is_old: bool) -> list[str]:
    """The old instance's security groups; else the cluster's (and, for the leader, the leader's)."""
    own = [g["GroupId"] for g in _primary(template).get("Groups", [])]
    if is_old and own:
        return own
    recorded = list(cluster.provider_state.get("security_groups", []))
    if not recorded:
        raise ProviderError(f"cannot replace {node.name}: the state records no security group of the cluster")
    return recorded[:2] if node.is_leader and leader.leader_only(cluster.options) else recorded[:1]


def _public_key(cluster: ClusterRecord) -> str:
    path = state.ClusterPaths(cluster.name).pubkey
    return path.read_text().strip() if path.exists() else ""


def _shutdown_behaviour(aws: Aws, cluster: ClusterRecord, template: dict) -> str:
    """What the node's instance does on an OS power-off (autostop may have changed it since `up`)."""
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_instance_attribute", InstanceId=template["InstanceId"],
                         Attribute="instanceInitiatedShutdownBehavior")
        value = found.get("InstanceInitiatedShutdownBehavior", {}).get("Value")
    except (ClientError, ToolError):
        value = None
    return value or az_launch.shutdown_behavior(cluster.options, cluster.autostop)


def _launch(aws: Aws, cluster: ClusterRecord, node: Node, params: dict, save: Callable[[], None]) -> str:
    """RunInstances; its id recorded and saved at once.  No capacity: one line naming the zone."""
    from botocore.exceptions import ClientError

    az = params["Placement"]["AvailabilityZone"]
    try:
        new_id = aws.call("run_instances", **params)["Instances"][0]["InstanceId"]
    except ClientError as exc:
        if is_code(exc, *NEXT_AZ_CODES):
            what = "no capacity" if is_code(exc, *CAPACITY_CODES) else "over a quota"
            raise ProviderError(
                f"cannot replace {node.name}: {what} for one more {params['InstanceType']} in {az} "
                f"({capacity.reason(exc)}); nothing was made and {node.name} is unchanged",
                hint="a replacement must be in the cluster's zone: try again later, or `clustertool cordon "
                     f"{node.name}` meanwhile") from None
        with aws_errors(f"launching the new {node.name} in {az}"):
            raise
    cluster.provider_state[PENDING]["new"] = new_id
    az_launch.recorder(cluster, save)("instances", new_id)
    return new_id


def _move_address(aws: Aws, cluster: ClusterRecord, node: Node, new_id: str, report: Reporter,
                  save: Callable[[], None]) -> bool:
    """The leader's Elastic IP (--access leader) moves to the new instance's primary interface."""
    addresses = cluster.provider_state.get("addresses") or []
    if not node.is_leader or not addresses:
        return False
    inst = _describe_one(aws, new_id) or {}
    eni = leader.primary_interface(inst)
    cluster.provider_state[PENDING]["address"] = addresses[0]
    save()
    report(f"{node.name}: moving the leader's Elastic IP to {new_id}")
    with aws_errors("moving the leader's Elastic IP"):
        aws.call("associate_address", AllocationId=addresses[0], NetworkInterfaceId=eni, AllowReassociation=True)
    return True


def _new_node(aws: Aws, node: Node, new_id: str) -> Node:
    inst = _describe_one(aws, new_id)
    if inst is None:
        raise ProviderError(f"the new instance {new_id} for {node.name} is gone")
    server = int(node.name.rsplit("-", 1)[1]) if node.is_server else 0
    new = instances.to_node(inst, index=node.index, leader=node.is_leader, slots=node.slots, server=server)
    new.name, new.cordon = node.name, None
    new.host_keys = instances.console_host_keys(aws, new_id)
    new.extra["replaced_instance"] = node.instance_id
    return new


def _undo(aws: Aws, cluster: ClusterRecord, new_id: str, old: dict | None, moved: bool, report: Reporter,
          save: Callable[[], None]) -> list[str]:
    """Terminate what the replacement launched (the Elastic IP back on the old leader); the old node stays
    as it was.  Returns what it did, for the message."""
    done = []
    if moved and old is not None and _usable(old):
        try:
            with aws_errors("moving the Elastic IP back to the old leader"):
                aws.call("associate_address", AllocationId=cluster.provider_state["addresses"][0],
                         NetworkInterfaceId=leader.primary_interface(old), AllowReassociation=True)
            done.append("the Elastic IP is back on the old leader")
        except ToolError as exc:
            report(f"warning: {exc.message}")
    pending = dict(cluster.provider_state.get(PENDING) or {}, new=new_id)
    made = _launched(aws, cluster, pending)
    if made:
        report(f"replace did not finish: terminating the new instance {', '.join(made)}")
        teardown.terminate_and_wait(aws, made, report)
        done.insert(0, f"the new instance {', '.join(made)} was terminated")
    for iid in made + [new_id]:
        az_launch.unrecord(cluster, "instances", iid)
    cluster.provider_state.pop(PENDING, None)
    save()
    return done


def _commit(cluster: ClusterRecord, node: Node, new: Node, save: Callable[[], None]) -> None:
    """The new node is the node from here on: in the record (by name) and saved."""
    names = [n.name for n in cluster.nodes]
    cluster.nodes[names.index(node.name)] = new
    cluster.provider_state.pop(PENDING, None)
    save()


def _retire(aws: Aws, cluster: ClusterRecord, node: Node, old: dict | None, new_id: str, keep_old: bool,
            report: Reporter, save: Callable[[], None]) -> None:
    """Terminate the old instance, or (--keep-old) stop it and tag it as replaced."""
    old_id = node.instance_id
    if not old_id or old is None or instances.state_of(old) == "terminated":
        report(f"{node.name}: the old instance {old_id or '?'} is already gone" + (" (nothing to keep)" if keep_old
                                                                                   else ""))
        if old_id:
            az_launch.unrecord(cluster, "instances", old_id)
            save()
        return
    with interrupts.deferred():
        if keep_old:
            cluster.provider_state.setdefault(KEPT, []).append(
                {"node": node.name, "instance": old_id, "by": new_id, "at": time.time()})
            save()
            report(f"{node.name}: stopping the old instance {old_id} and tagging it {REPLACED_BY}={new_id}")
            values = {REPLACED_BY: new_id, tags.ROLE: REPLACED_ROLE,
                      tags.NAME: f"{tags.as_dict(old.get('Tags')).get(tags.NAME) or node.name}-replaced"}
            with aws_errors(f"tagging the old {node.name} as replaced"):
                aws.call("create_tags", Resources=[old_id], Tags=tags.pairs(values))
            with aws_errors(f"stopping the old {node.name}"):
                aws.call("stop_instances", InstanceIds=[old_id])
            return
        report(f"{node.name}: terminating the old instance {old_id}")
        teardown.terminate_and_wait(aws, [old_id], report)
        az_launch.unrecord(cluster, "instances", old_id)
        save()


def kept_lines(cluster: ClusterRecord) -> dict[str, str]:
    """Status lines: old instances `replace --keep-old` stopped and kept (billed for their disks)."""
    out = {}
    for kept in cluster.provider_state.get(KEPT, []):
        out[f"{kept['node']} old instance"] = (f"{kept['instance']} stopped and kept (replaced by {kept['by']}; its "
                                               "EBS volume is still billed); `clustertool down` removes it")
    return out
