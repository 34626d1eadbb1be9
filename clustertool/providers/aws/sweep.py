"""`down --sweep`: resources tagged by clustertool whose cluster this machine does not know.

These are what an `up` killed hard (power loss, SIGKILL) or a deleted state directory leave
behind; they cost money until someone removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from clustertool.model import Reporter, silent
from clustertool.providers.aws import instances as inst_mod
from clustertool.providers.aws import placement, tags, teardown
from clustertool.providers.aws.client import Aws


@dataclass
class Orphan:
    kind: str  # instance | placement-group | security-group | key-pair
    id: str
    cluster: str
    region: str
    profile: str | None = None


def find_orphans(region: str | None = None, profile: str | None = None,
                 known: Iterable[str] = ()) -> list[Orphan]:
    aws = Aws(region=region, profile=profile)
    known = set(known)
    found: list[Orphan] = []

    def add(kind: str, rid: str, tag_list) -> None:
        owner = tags.as_dict(tag_list).get(tags.CLUSTER, "")
        if owner not in known:
            found.append(Orphan(kind, rid, owner, aws.region, profile))

    for inst in inst_mod.tagged(aws, None):
        add("instance", inst["InstanceId"], inst.get("Tags"))
    for group in placement.tagged(aws, None):
        add("placement-group", group["GroupName"], group.get("Tags"))
    for group in teardown.tagged_security_groups(aws, None):
        add("security-group", group["GroupId"], group.get("Tags"))
    for key in teardown.tagged_key_pairs(aws, None):
        add("key-pair", key["KeyName"], key.get("Tags"))
    return found


def delete_orphans(orphans: list[Orphan], report: Reporter = silent) -> list[str]:
    """Remove them, instances first (waiting until terminated), per region; returns what went."""
    removed: list[str] = []
    by_place: dict[tuple[str, str | None], list[Orphan]] = {}
    for orphan in orphans:
        by_place.setdefault((orphan.region, orphan.profile), []).append(orphan)
    for (region, profile), items in by_place.items():
        aws = Aws(region=region, profile=profile)
        pick = lambda kind: [o.id for o in items if o.kind == kind]  # noqa: E731
        owned = teardown.Owned(instances=pick("instance"), placement_groups=pick("placement-group"),
                               security_groups=pick("security-group"), key_pairs=pick("key-pair"))
        teardown.remove(aws, owned, report)
        removed += [f"{o.kind} {o.id}" for o in items]
    return removed
