"""The tags clustertool puts on everything it creates: the source of truth for what a cluster owns.

A cluster is found by its id (``clustertool:id``, the name plus a random suffix, unique per
`up`), never by its name alone: two users' clusters may share a name.  Every resource also says
who made it (``clustertool:owner``, the AWS identity; ``clustertool:home``, the clustertool home)
and, while `up` runs, until when that `up` is alive (``clustertool:lease``, an epoch second that
`up` keeps moving forward, ``done`` once it finished).
"""

from __future__ import annotations

from dataclasses import dataclass

CLUSTER = "clustertool:cluster"
ID = "clustertool:id"
OWNER = "clustertool:owner"
HOME = "clustertool:home"
LEASE = "clustertool:lease"
CREATED = "clustertool:created"
ROLE = "clustertool:role"
NODE = "clustertool:node"
NAME = "Name"
DONE = "done"


def pairs(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in values.items()]


@dataclass
class Stamp:
    """The identity tags of one cluster, as every resource of it carries them."""

    cluster: str
    id: str = ""
    owner: str = ""
    home: str = ""
    lease: str = ""
    created: str = ""

    def values(self) -> dict[str, str]:
        found = {CLUSTER: self.cluster, ID: self.id, OWNER: self.owner, HOME: self.home, LEASE: self.lease,
                 CREATED: self.created}
        return {k: v for k, v in found.items() if v}

    def spec(self, resource_type: str, name: str | None = None, **extra: str) -> dict:
        """One TagSpecifications entry for ``resource_type`` (extra keys: '__' stands for ':')."""
        values = {**self.values(), **{k.replace("__", ":"): v for k, v in extra.items()}}
        if name:
            values[NAME] = name
        return {"ResourceType": resource_type, "Tags": pairs(values)}

    def filter(self) -> list[dict]:
        """What finds this cluster's resources: its id (a state from before ids: its name)."""
        return id_filter(self.id) if self.id else cluster_filter(self.cluster)

    def owns(self, tag_list: list[dict] | None) -> bool:
        """Whether a resource found by :meth:`filter` is this cluster's: with no id (an old state),
        only resources that carry no id either (a newer cluster of the same name is not this one)."""
        values = as_dict(tag_list)
        return values.get(ID) == self.id if self.id else ID not in values


def id_filter(cluster_id: str) -> list[dict]:
    return [{"Name": f"tag:{ID}", "Values": [cluster_id]}]


def cluster_filter(cluster: str) -> list[dict]:
    return [{"Name": f"tag:{CLUSTER}", "Values": [cluster]}]


def any_cluster_filter() -> list[dict]:
    return [{"Name": "tag-key", "Values": [CLUSTER]}]


def as_dict(tag_list: list[dict] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tag_list or []}


def node_name(cluster: str, index: int, leader: bool) -> str:
    """The Name tag: <cluster>-leader / <cluster>-node-K (as `ssh <cluster>-node-K`)."""
    return f"{cluster}-leader" if leader else f"{cluster}-node-{index}"
