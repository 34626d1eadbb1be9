"""``--access leader`` on AWS: only the leader has a public address and takes SSH from the caller.

Every node is launched without a public IP (``AssociatePublicIpAddress`` false; with several EFA
interfaces AWS gives none anyway) in the cluster's security group, which lets members talk freely
and admits no one else.  The leader's primary interface also gets the leader group (SSH from
``--ssh-cidr`` only) and an Elastic IP, tagged like everything else, recorded the moment it is
allocated and released by teardown (and counted by sweeps and leak checks).  Members are reached
through the leader (remote/access.py).  With ``--jump`` no address is public: the leader group
admits SSH from the bastion's range.
"""

from __future__ import annotations

from typing import Callable

from clustertool.core.errors import ProviderError
from clustertool.providers.aws import network, tags
from clustertool.providers.aws.client import Aws, aws_errors

Record = Callable[[str, str], None]


def wants_public_ip(options: dict) -> bool:
    """Whether every node asks for a public IP at launch (only ``--access all`` without a jump).  Options
    without an access mode are a state from before access modes: every node had a public IP."""
    return (options.get("access") or "all") == "all" and not options.get("jump")


def leader_only(options: dict) -> bool:
    return (options.get("access") or "all") == "leader"


def gets_elastic_ip(options: dict) -> bool:
    return leader_only(options) and not options.get("jump")


def primary_interface(instance: dict) -> str:
    """The interface at network card 0, device 0: where the public address and SSH live."""
    for eni in instance.get("NetworkInterfaces", []):
        attachment = eni.get("Attachment") or {}
        if attachment.get("DeviceIndex", 0) == 0 and attachment.get("NetworkCardIndex", 0) == 0:
            return eni["NetworkInterfaceId"]
    raise ProviderError(f"instance {instance.get('InstanceId')} has no primary network interface")


def create_group(aws: Aws, stamp: tags.Stamp, vpc_id: str, cidr: str, record: Record) -> str:
    """The leader's own security group: SSH from ``cidr`` only."""
    return network.tagged_group(aws, stamp, vpc_id, f"clustertool-{stamp.id}-leader",
                                f"clustertool cluster {stamp.cluster}: SSH to the leader from {cidr}",
                                lambda _group_id: network.ssh_rules(cidr), record, "the leader's security group")


def attach(aws: Aws, leader: dict, groups: list[str]) -> str:
    """Put the leader's primary interface in ``groups`` (the cluster's and the leader's); its id."""
    eni = primary_interface(leader)
    with aws_errors("adding the leader to its security group"):
        aws.call("modify_network_interface_attribute", NetworkInterfaceId=eni, Groups=groups)
    return eni


def elastic_ip(aws: Aws, stamp: tags.Stamp, eni: str, record: Record) -> str:
    """Allocate a tagged Elastic IP (recorded at once), associate it with ``eni``; its public address."""
    with aws_errors("allocating the leader's Elastic IP"):
        found = aws.call("allocate_address", Domain="vpc",
                         TagSpecifications=[stamp.spec("elastic-ip", f"{stamp.cluster}-leader")])
    record("addresses", found["AllocationId"])
    with aws_errors("associating the leader's Elastic IP"):
        aws.call("associate_address", AllocationId=found["AllocationId"], NetworkInterfaceId=eni,
                 AllowReassociation=False)
    return found["PublicIp"]


def plan_lines(options: dict, cidr: tuple[str, str] | None, name: str) -> list[str]:
    """What the plan says about access: who gets an address, which group admits SSH from where."""
    source = f"{cidr[0]} ({cidr[1]})" if cidr else "?"
    if not leader_only(options):
        via = f"; every node reached through --jump {options['jump']}" if options.get("jump") else ""
        return [f"access: all: every node {'has no public IP' if options.get('jump') else 'gets a public IP'} "
                f"and takes SSH from {source}{via}"]
    first = (f"the leader is reached through --jump {options['jump']} (no public address)" if options.get("jump")
             else "only the leader gets a public address: an Elastic IP tagged with the cluster's tags, "
                  "released at down")
    return [f"access: leader: {first}; members have no public address",
            f"  leader security group (new, clustertool-{name}-<suffix>-leader): inbound tcp/22 (SSH) from {source}",
            "  members: no SSH rule for you; reached through the leader (ProxyJump, host keys pinned on both hops)"]
