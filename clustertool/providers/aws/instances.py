"""Instances as nodes: describe, wait for states, status checks, SSH port, console host keys."""

from __future__ import annotations

import socket
import time
from typing import AbstractSet, Callable, Iterable

from clustertool.core import interrupts
from clustertool.core.errors import ProviderError
from clustertool.core.model import LEADER, MEMBER, SERVER, Node
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors, poll_interval, wait_timeout

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
NOT_RUNNING = {"terminated", "shutting-down", "stopped", "stopping"}
SERVER_TAG = "clustertool:server"  # a reduction server's number (servers.SERVER)
BEGIN_KEYS, END_KEYS = "-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"


def describe(aws: Aws, ids: Iterable[str] = (), filters: list[dict] | None = None) -> list[dict]:
    """Instances by id and/or filters; ids that no longer exist are simply absent."""
    ids = list(ids)
    flt = list(filters or [])
    if ids:
        flt.append({"Name": "instance-id", "Values": ids})
    with aws_errors("describing instances"):
        reservations = aws.paginate("describe_instances", "Reservations", Filters=flt)
    return [inst for r in reservations for inst in r.get("Instances", [])]


def tagged_by(aws: Aws, filters: list[dict], live_only: bool = True) -> list[dict]:
    """Instances matching tag ``filters`` (tags.Stamp.filter(), tags.any_cluster_filter()), not yet terminated."""
    if live_only:
        filters = filters + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
    return describe(aws, filters=filters)


def reason_of(inst: dict) -> str:
    """Why an instance is in its state, as EC2 says (e.g. 'Server.SpotInstanceTermination: ...')."""
    reason = inst.get("StateReason", {}).get("Message") or inst.get("StateTransitionReason") or ""
    return " ".join(str(reason).split()) or "no reason given"


def gone_error(found: dict[str, dict], states: dict[str, str], what: str) -> ProviderError:
    detail = ", ".join(f"{iid} is {s} ({reason_of(found.get(iid, {}))})" for iid, s in states.items())
    return ProviderError(f"{what}: {detail}",
                         hint="the state reason says why; `aws ec2 describe-instances` shows it too")


def state_of(inst: dict) -> str:
    return inst.get("State", {}).get("Name", "unknown")


def wait_for_state(aws: Aws, ids: list[str], wanted: set[str], *, what: str,
                   bad: AbstractSet[str] = frozenset(), timeout: float | None = None) -> list[dict]:
    """Poll until every instance is in ``wanted`` (missing ones count as terminated)."""
    timeout = wait_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        found = {i["InstanceId"]: i for i in describe(aws, ids)}
        states = {iid: state_of(found[iid]) if iid in found else "terminated" for iid in ids}
        broken = {iid: s for iid, s in states.items() if s in bad}
        if broken:
            raise gone_error(found, broken, f"while waiting for instances to be {what}")
        if all(s in wanted for s in states.values()):
            return [found[iid] for iid in ids if iid in found]
        if time.monotonic() >= deadline:
            waiting = ", ".join(f"{iid}={s}" for iid, s in states.items() if s not in wanted)
            raise ProviderError(f"instances not {what} after {timeout:.0f}s: {waiting}",
                                hint="run the command again to keep waiting, or check the EC2 console")
        time.sleep(poll_interval())
        interrupts.checkpoint()


def wait_status_ok(aws: Aws, ids: list[str], timeout: float | None = None) -> None:
    """Until every instance is running with system and instance checks ``ok``: ``not-applicable``
    is what EC2 answers for an instance that is not running, so it is not a pass; an instance
    that stops or terminates meanwhile, or is impaired, is an error naming the reason."""
    timeout = wait_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        with aws_errors("reading instance status checks"):
            statuses = aws.paginate("describe_instance_status", "InstanceStatuses",
                                    InstanceIds=ids, IncludeAllInstances=True)
        by_id = {s["InstanceId"]: s for s in statuses}
        states = {iid: by_id[iid].get("InstanceState", {}).get("Name", "unknown") if iid in by_id else "terminated"
                  for iid in ids}
        broken = {iid: s for iid, s in states.items() if s in NOT_RUNNING}
        if broken:
            raise gone_error({i["InstanceId"]: i for i in describe(aws, list(broken))}, broken,
                             "instances went away while their status checks were awaited")
        checks = {iid: (s.get("SystemStatus", {}).get("Status"), s.get("InstanceStatus", {}).get("Status"))
                  for iid, s in by_id.items()}
        impaired = [iid for iid, pair in checks.items() if "impaired" in pair]
        if impaired:
            raise ProviderError(f"status checks failed (impaired) on {', '.join(impaired)}",
                                hint="`clustertool down` and up again; AWS retires impaired hardware")
        if len(checks) == len(ids) and all(states[i] == "running" and p == ("ok", "ok") for i, p in checks.items()):
            return
        if time.monotonic() >= deadline:
            waiting = ", ".join(f"{i}={'/'.join(str(x) for x in p)}" for i, p in checks.items() if p != ("ok", "ok"))
            raise ProviderError(f"status checks not passed after {timeout:.0f}s: {waiting}")
        time.sleep(poll_interval())


def check_running(aws: Aws, ids: list[str]) -> list[dict]:
    """The last word of `up`: every instance running (missing ones count as terminated)."""
    found = {i["InstanceId"]: i for i in describe(aws, ids)}
    states = {iid: state_of(found[iid]) if iid in found else "terminated" for iid in ids}
    broken = {iid: s for iid, s in states.items() if s != "running"}
    if broken:
        raise gone_error(found, broken, "not every instance is running at the end of up")
    return [found[iid] for iid in ids]


def wait_ssh_port(hosts: list[str], port: int = 22, timeout: float | None = None,
                  tick: Callable[[], object] = lambda: None) -> None:
    """Until every host accepts TCP on ``port``; ``tick()`` runs every poll (the up's checks)."""
    timeout = wait_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    pending = set(hosts)
    while pending:
        for host in sorted(pending):
            try:
                with socket.create_connection((host, port), timeout=3):
                    pending.discard(host)
            except OSError:
                pass
        if pending and time.monotonic() >= deadline:
            raise ProviderError(f"SSH port {port} not answering after {timeout:.0f}s on: {', '.join(sorted(pending))}",
                                hint="check --ssh-cidr matches the address you connect from")
        if pending:
            time.sleep(poll_interval())
            tick()


def host_keys_from_console(text: str) -> list[str]:
    """'type base64' lines from cloud-init's SSH HOST KEY KEYS block of the console output."""
    if BEGIN_KEYS not in (text or ""):
        return []
    block = text.split(BEGIN_KEYS, 1)[1].split(END_KEYS, 1)[0]
    keys = []
    for line in block.splitlines():
        parts = line.strip().split()
        if len(parts) >= 2 and (parts[0].startswith("ssh-") or parts[0].startswith("ecdsa-")):
            keys.append(f"{parts[0]} {parts[1]}")
    return keys


def console_host_keys(aws: Aws, instance_id: str) -> list[str]:
    from botocore.exceptions import ClientError

    try:
        output = aws.call("get_console_output", InstanceId=instance_id).get("Output") or ""
    except ClientError:
        return []  # keys are then pinned on first contact
    if output and BEGIN_KEYS not in output:
        try:
            import base64

            output = base64.b64decode(output).decode(errors="replace")
        except ValueError:
            pass
    return host_keys_from_console(output)


def efa_interfaces(inst: dict) -> int | None:
    """EFA interfaces attached to the instance (InterfaceType efa or efa-only), for `doctor --check efa`;
    None when the description carries no interface types (moto's, for one)."""
    kinds = [ni.get("InterfaceType") for ni in inst.get("NetworkInterfaces") or []]
    return sum(k in ("efa", "efa-only") for k in kinds) if any(kinds) else None


def to_node(inst: dict, *, index: int, leader: bool, slots: int, server: int = 0) -> Node:
    """``server`` > 0: reduction server number ``server`` (named server-<j>, no slots)."""
    private = inst.get("PrivateIpAddress") or ""
    role = SERVER if server else LEADER if leader else MEMBER
    efa = efa_interfaces(inst)
    return Node(
        name=f"server-{server}" if server else f"node-{index}", index=index, address=private, role=role,
        slots=0 if server else slots,
        ssh_host=inst.get("PublicIpAddress") or private or None, state=state_of(inst),
        instance_id=inst["InstanceId"],
        extra={"az": inst.get("Placement", {}).get("AvailabilityZone", ""),
               "instance_type": inst.get("InstanceType", ""),
               "launch_time": str(inst.get("LaunchTime", "")), "spot": inst.get("InstanceLifecycle") == "spot",
               **({"efa_interfaces": efa} if efa is not None else {})},
    )


def nodes_from_tags(instances: list[dict], slots: int) -> list[Node]:
    """Nodes of instances the tool launched: index and role from their tags (before `up` tagged
    them: launch order, the first being the leader, as `up` would have tagged them)."""
    ordered = sorted(instances, key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))
    tagged_leader = any(tags.as_dict(i.get("Tags")).get(tags.ROLE) == "leader" for i in ordered)
    nodes = []
    for k, inst in enumerate(ordered, start=1):
        values = tags.as_dict(inst.get("Tags"))
        index = int(values.get(tags.NODE, "0") or 0) or k
        leader = values.get(tags.ROLE) == "leader" if tagged_leader else k == 1
        server = int(values.get(SERVER_TAG, "0") or 0) if values.get(tags.ROLE) == SERVER else 0
        nodes.append(to_node(inst, index=index, leader=leader and not server, slots=slots, server=server))
    return sorted(nodes, key=lambda n: n.index)


def refresh(aws: Aws, nodes: list[Node], *, keep_keys: bool = True) -> list[Node]:
    """The same nodes with current state and addresses (they change across stop/start)."""
    found = {i["InstanceId"]: i for i in describe(aws, [n.instance_id for n in nodes if n.instance_id])}
    out = []
    for node in nodes:
        inst = found.get(node.instance_id or "")
        if inst is None:
            node.state = "missing"
            out.append(node)
            continue
        server = int(node.name.rsplit("-", 1)[1]) if node.is_server else 0
        fresh = to_node(inst, index=node.index, leader=node.is_leader, slots=node.slots, server=server)
        fresh.name = node.name
        fresh.host_keys = node.host_keys if keep_keys else []
        fresh.extra.update({k: node.extra[k] for k in ("network_nodes",) if k in node.extra})  # the path `up` recorded
        out.append(fresh)
    return out


def ids_of(nodes: list[Node]) -> list[str]:
    return [n.instance_id for n in nodes if n.instance_id]

