"""Who a cluster belongs to: the caller's AWS identity (STS) plus this machine's clustertool home.

Two people sharing one AWS account (even one IAM user) have different homes, so their clusters
never count as each other's.  ``up`` refuses a name that another owner's live cluster uses in the
region; ``down``/``stop``/``start`` refuse a cluster whose resources say another owner made it,
unless ``--force-owner``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from clustertool.core import state
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import ClusterRecord, Reporter
from clustertool.providers.aws import census, controller_policy, lease, tags
from clustertool.providers.aws.client import Aws, aws_errors


@dataclass(frozen=True)
class Owner:
    arn: str
    home: str

    def matches(self, arn: str, home: str) -> bool:
        return home == self.home and principal(arn) == principal(self.arn)

    def tags(self) -> dict[str, str]:
        return {tags.OWNER: self.arn, tags.HOME: self.home}


def principal(arn: str) -> str:
    """The identity without an assumed role's session name (which changes every session)."""
    parts = (arn or "").split(":", 5)
    if len(parts) == 6 and parts[5].startswith("assumed-role/"):
        parts[5] = "/".join(parts[5].split("/")[:2])
    return ":".join(parts)


def describe(arn: str, home: str) -> str:
    if not arn and not home:
        return "unknown owner (made before owner tags)"
    return f"{arn or '?'} (home {home or '?'})"


def caller(aws: Aws) -> Owner:
    """The owner this command acts as; one STS call per session."""
    cached = getattr(aws, "_owner", None)
    if cached is None:
        with aws_errors("asking STS who the caller is"):
            arn = aws.call("get_caller_identity", service="sts").get("Arn", "")
        cached = Owner(principal(arn), state.home_id())
        aws._owner = cached
    return cached


def _age(found: census.Found) -> str:
    age = found.age()
    if age is None:
        return "age unknown"
    return f"made {age / 60:.0f} min ago" if age < 7200 else f"made {age / 3600:.1f} h ago"


def check_name_free(aws: Aws, name: str, me: Owner, report: Reporter) -> None:
    """Before anything is made: refuse a name a live cluster of another owner uses in this region."""
    for found in census.collect(aws, name, kinds=("instance", "security-group")).values():
        if found.owner and me.matches(found.owner, found.home):
            report(f"note: an earlier cluster {found.key} of yours left {found.count()} resource(s) here; "
                   "`clustertool down --sweep` removes them")
            continue
        if found.lease not in (None, tags.DONE) and not lease.live(found.lease) and not found.instances:
            report(f"note: leftovers of a failed up of another owner ({found.key}); `down --sweep` removes them")
            continue
        raise UsageError(f"cluster name {name!r} is already used in {aws.region} by {found.key or 'a cluster'} of "
                         f"{describe(found.owner, found.home)}, {_age(found)}, {lease.describe(found.lease)}",
                         hint="pick another --name; `clustertool down --sweep` lists clusters and their owners")


def check_race(aws: Aws, stamp: tags.Stamp, me: Owner) -> None:
    """After our first resource exists: if another owner's `up` of the same name started first,
    this one gives way (both see each other; the later one loses)."""
    mine = (float(stamp.created or 0), stamp.id)
    for found in census.collect(aws, stamp.cluster, kinds=("security-group",)).values():
        if found.id == stamp.id or (found.owner and me.matches(found.owner, found.home)):
            continue
        if (found.created or 0.0, found.id) < mine:
            raise ProviderError(f"cluster name {stamp.cluster!r} was taken in {aws.region} a moment earlier by "
                                f"{found.key} of {describe(found.owner, found.home)}",
                                hint="pick another --name")


def confirm(aws: Aws, cluster: ClusterRecord, force: bool, verb: str) -> None:
    """Refuse to act on a cluster whose state or resources say another owner made it."""
    me = caller(aws)
    if controller_policy.is_controller_of(me.arn, cluster.id):
        return  # the cluster's own recovery controller (controller_iam.py): it acts for the owner, on this cluster only
    recorded = cluster.provider_state.get("owner") or {}
    seen = [(recorded.get("arn", ""), recorded.get("home", ""))] if recorded else []
    if cluster.id:
        stamp = tags.Stamp(cluster.name, cluster.id)
        seen += [(f.owner, f.home) for f in census.collect(aws, cluster.name, kinds=("instance", "security-group"))
                 .values() if f.id == stamp.id and (f.owner or f.home)]
    for arn, home in seen:
        if not me.matches(arn, home):
            if force:
                return
            raise ProviderError(f"cluster {cluster.name!r} ({cluster.id or 'no id'}) belongs to "
                                f"{describe(arn, home)}, not to you ({describe(me.arn, me.home)})",
                                hint=f"`clustertool {verb} --force-owner` acts on it anyway")


def stamp_for(cluster: ClusterRecord, me: Owner) -> tags.Stamp:
    """The tags of everything this `up` makes; the lease starts now."""
    return tags.Stamp(cluster.name, cluster.id, owner=me.arn, home=me.home, lease=lease.expiry(),
                      created=f"{time.time():.3f}")
