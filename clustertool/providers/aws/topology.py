"""The network nodes above each instance (DescribeInstanceTopology), and the tags that follow when
`up` puts the nodes in topology order (cluster/topology_order.py).

EC2 answers for running instances of the types it describes (p3dn, p4d, p4de, p5, trn1, hpc… and
more over time); other instances are simply absent from the answer.  A call EC2 refuses (no
ec2:DescribeInstanceTopology permission, a region or endpoint without the API) means "unknown":
the launch order stays, and nothing is said, since the cluster works the same.
"""

from __future__ import annotations

from clustertool.core.errors import ProviderError
from clustertool.core.model import ClusterRecord
from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors

BATCH = 100  # instance ids per DescribeInstanceTopology call (the API's limit)
MOVED = "renumbered_from"  # node.extra: the launch name of a node `up` renumbered (cluster/topology_order.py)


def paths(aws: Aws, cluster: ClusterRecord) -> dict[str, list[str]]:
    """Node name -> network nodes, outermost first; {} when EC2 does not say."""
    from botocore.exceptions import ClientError

    by_id = {n.instance_id: n.name for n in cluster.nodes if n.instance_id and not n.is_server}
    ids = sorted(by_id)
    found: dict[str, list[str]] = {}
    try:
        for start in range(0, len(ids), BATCH):
            for item in aws.paginate("describe_instance_topology", "Instances", InstanceIds=ids[start:start + BATCH]):
                if item.get("InstanceId") in by_id and item.get("NetworkNodes"):
                    found[by_id[item["InstanceId"]]] = list(item["NetworkNodes"])
    except (ClientError, ProviderError):  # not allowed, not offered here: the order stays as launched
        return {}
    return found


def retag(aws: Aws, cluster: ClusterRecord) -> None:
    """Give each worker instance the index and Name of its node as the state has them now (after
    `up` renumbered the nodes in topology order); instances already tagged so are left alone."""
    for node in cluster.nodes:
        if node.is_server or not node.instance_id or MOVED not in node.extra:
            continue
        values = {tags.NODE: str(node.index), tags.NAME: tags.node_name(cluster.name, node.index, node.is_leader)}
        with aws_errors(f"tagging {node.instance_id} as {node.name}"):
            aws.call("create_tags", Resources=[node.instance_id], Tags=tags.pairs(values))
        del node.extra[MOVED]
