"""The tags clustertool puts on everything it creates: the source of truth for what a cluster owns."""

from __future__ import annotations

CLUSTER = "clustertool:cluster"
ROLE = "clustertool:role"
NODE = "clustertool:node"
NAME = "Name"


def pairs(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in values.items()]


def spec(resource_type: str, cluster: str, name: str | None = None, **extra: str) -> dict:
    """One TagSpecifications entry: cluster tag (+ Name and extra tags) for ``resource_type``."""
    values = {CLUSTER: cluster, **{k.replace("__", ":"): v for k, v in extra.items()}}
    if name:
        values[NAME] = name
    return {"ResourceType": resource_type, "Tags": pairs(values)}


def cluster_filter(cluster: str) -> list[dict]:
    return [{"Name": f"tag:{CLUSTER}", "Values": [cluster]}]


def any_cluster_filter() -> list[dict]:
    return [{"Name": "tag-key", "Values": [CLUSTER]}]


def as_dict(tag_list: list[dict] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tag_list or []}


def node_name(cluster: str, index: int, leader: bool) -> str:
    """The Name tag: <cluster>-leader / <cluster>-node-K (as `ssh <cluster>-node-K`)."""
    return f"{cluster}-leader" if leader else f"{cluster}-node-{index}"
