"""Where nodes live on the network: subnet, the cluster's security group, SSH source, key pair."""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any, Callable

from clustertool.core.errors import ProviderError, UsageError
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors, is_code

Record = Callable[[str, str], None]
SSH_CIDR_HINT = "pass --ssh-cidr with the address you connect from, e.g. --ssh-cidr 203.0.113.7/32"


def parse_cidr(text: str, where: str = "--ssh-cidr") -> str:
    """A validated CIDR block; a bare address becomes /32 (or /128)."""
    try:
        net = ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not an IP address or CIDR block", hint=SSH_CIDR_HINT) from None
    return str(net)


def _global(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_global
    except ValueError:
        return False


def _route_source() -> str | None:
    """This machine's source address toward the internet; a UDP connect sends no packet."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: only a route lookup happens
            return sock.getsockname()[0]
    except OSError:
        return None


def caller_cidr() -> tuple[str, str] | None:
    """The caller's own address as a /32, when it can be found without asking the internet."""
    env = os.environ.get("CLUSTERTOOL_MY_IP")
    if env:
        return parse_cidr(env, "CLUSTERTOOL_MY_IP"), "CLUSTERTOOL_MY_IP"
    client = (os.environ.get("SSH_CONNECTION") or "").split()
    if client and _global(client[0]):
        return parse_cidr(client[0]), "the address of your SSH session (SSH_CONNECTION)"
    source = _route_source()
    if source and _global(source):
        return parse_cidr(source), "this machine's public address"
    return None


def ssh_cidr(option: str | None) -> tuple[str, str]:
    """(cidr, where it came from); refuses rather than opening SSH to the world silently."""
    if option:
        return parse_cidr(option), "--ssh-cidr"
    found = caller_cidr()
    if not found:
        raise UsageError("cannot tell which address you connect from, so SSH would have no allowed source",
                         hint=SSH_CIDR_HINT + " (or set CLUSTERTOOL_MY_IP); 0.0.0.0/0 only if you mean it")
    return found


def ssh_rules(cidr: str) -> list[dict]:
    """SSH from ``cidr`` only."""
    ranges = ({"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "clustertool ssh"}]} if ":" in cidr
              else {"IpRanges": [{"CidrIp": cidr, "Description": "clustertool ssh"}]})
    return [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}]


def security_rules(group_id: str, cidr: str | None) -> list[dict]:
    """All traffic among the cluster's members (NCCL, MPI, EFA), and SSH from ``cidr`` only (None: no
    SSH rule here, as with --access leader, where the leader's own group has it)."""
    members = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "cluster members"}]}]
    return members + (ssh_rules(cidr) if cidr else [])


def describe_rules(cidr: str | None) -> list[str]:
    ssh = [f"inbound: tcp/22 (SSH) from {cidr} only"] if cidr else ["no inbound SSH rule (members)"]
    return ["inbound: all traffic from members of the cluster's own security group (NCCL/MPI/EFA)",
            *ssh, "outbound: all (AWS default)"]


def subnet_for(aws: Aws, az: str, subnet: str | None) -> tuple[str, str]:
    """(subnet id, vpc id): --subnet (which must be in ``az``), else the default VPC's subnet in ``az``."""
    if subnet:
        found = _describe_subnets(aws, SubnetIds=[subnet])
        if not found:
            raise UsageError(f"--subnet {subnet} not found in {aws.region}")
        if found[0]["AvailabilityZone"] != az:
            raise UsageError(f"--subnet {subnet} is in {found[0]['AvailabilityZone']}, not {az}",
                             hint="give --az the subnet's zone, or leave --az out")
        return subnet, found[0]["VpcId"]
    found = _describe_subnets(aws, Filters=[{"Name": "availability-zone", "Values": [az]},
                                            {"Name": "default-for-az", "Values": ["true"]}])
    if not found:
        raise ProviderError(f"no default subnet in {az}", hint="pass --subnet subnet-... in that zone")
    return found[0]["SubnetId"], found[0]["VpcId"]


def vpc_for(aws: Aws, subnet: str | None) -> str:
    """The VPC the cluster's security group belongs in: --subnet's, else the default VPC."""
    if subnet:
        found = _describe_subnets(aws, SubnetIds=[subnet])
        if not found:
            raise UsageError(f"--subnet {subnet} not found in {aws.region}")
        return found[0]["VpcId"]
    with aws_errors("finding the default VPC"):
        vpcs = aws.call("describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}]).get("Vpcs", [])
    if not vpcs:
        raise UsageError(f"{aws.region} has no default VPC", hint="pass --subnet subnet-... of the VPC to use")
    return vpcs[0]["VpcId"]


def subnet_az(aws: Aws, subnet: str) -> str:
    found = _describe_subnets(aws, SubnetIds=[subnet])
    if not found:
        raise UsageError(f"--subnet {subnet} not found in {aws.region}")
    return found[0]["AvailabilityZone"]


def _describe_subnets(aws: Aws, **kwargs: Any) -> list[dict]:  # DescribeSubnets parameters
    from botocore.exceptions import ClientError

    try:
        return aws.call("describe_subnets", **kwargs).get("Subnets", [])
    except ClientError as exc:
        if is_code(exc, "InvalidSubnetID"):
            return []
        with aws_errors("describing subnets"):
            raise


def vpc_cidr(aws: Aws, vpc_id: str) -> str:
    """The VPC's own address range (where a --jump bastion lives, by default)."""
    with aws_errors("describing the VPC"):
        vpcs = aws.call("describe_vpcs", VpcIds=[vpc_id]).get("Vpcs", [])
    if not vpcs or not vpcs[0].get("CidrBlock"):
        raise ProviderError(f"VPC {vpc_id} has no address range", hint="pass --ssh-cidr with the bastion's address")
    return vpcs[0]["CidrBlock"]


def tagged_group(aws: Aws, stamp: tags.Stamp, vpc_id: str, name: str, description: str,
                 rules: Callable[[str], list[dict]], record: Record,
                 what: str = "the security group") -> str:
    """Create a tagged security group, record it the moment it exists, then add ``rules(group_id)``."""
    with aws_errors(f"creating {what}"):
        group_id = aws.call("create_security_group", GroupName=name, VpcId=vpc_id, Description=description,
                            TagSpecifications=[stamp.spec("security-group", name)])["GroupId"]
    record("security_groups", group_id)
    with aws_errors(f"adding the rules of {what}"):
        aws.call("authorize_security_group_ingress", GroupId=group_id, IpPermissions=rules(group_id))
    return group_id


def create_security_group(aws: Aws, stamp: tags.Stamp, vpc_id: str, cidr: str | None, record: Record) -> str:
    what = f"SSH from {cidr}" if cidr else "SSH only to the leader"
    return tagged_group(aws, stamp, vpc_id, f"clustertool-{stamp.id}",
                        f"clustertool cluster {stamp.cluster}: members talk freely, {what}",
                        lambda group_id: security_rules(group_id, cidr), record)


def import_key_pair(aws: Aws, stamp: tags.Stamp, public_key: str, record: Record) -> str:
    name = f"clustertool-{stamp.id}"
    if not public_key.strip():
        raise ProviderError("the cluster has no public key to import")
    with aws_errors("importing the cluster key pair"):
        aws.call("import_key_pair", KeyName=name, PublicKeyMaterial=public_key.strip().encode(),
                 TagSpecifications=[stamp.spec("key-pair", name)])
    record("key_pairs", name)
    return name


def check_key_name(aws: Aws, key_name: str) -> None:
    from botocore.exceptions import ClientError

    try:
        aws.call("describe_key_pairs", KeyNames=[key_name])
    except ClientError as exc:
        if is_code(exc, "InvalidKeyPair"):
            raise UsageError(f"--key-name {key_name}: no such key pair in {aws.region}") from None
        with aws_errors("describing the key pair"):
            raise
