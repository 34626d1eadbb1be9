"""`down --sweep`: clusters in AWS that no state of this clustertool home knows, with owner and age.

What it deletes: clusters of this home whose state was lost (a SIGKILLed `up`, a deleted state
file), another owner's `up` that died (its lease expired before it finished), and resources
made before clusters had ids or owners.  What it never deletes: a cluster whose `up` is in
flight (live lease), wherever it runs.  Another owner's complete cluster is listed and kept,
unless ``--force-owner``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from clustertool.core.durations import short_age
from clustertool.core.model import Reporter, silent
from clustertool.providers.aws import census, filesystems_down, lease, owner, tags, teardown
from clustertool.providers.aws.client import Aws
from clustertool.providers.base import Sweep, SweepRemoved, SweepRequest

DELETE, KEEP = "delete", "keep"


@dataclass
class Swept:
    """One cluster the sweep found, and what it does with it."""

    name: str
    id: str
    owner: str
    age_s: float | None
    lease: str
    region: str
    resources: dict[str, list[str]] = field(default_factory=dict)
    action: str = KEEP
    why: str = ""
    ours: bool = False  # made from this clustertool home (its local leftovers go too)
    profile: str | None = None
    per_hour: float | None = 0.0  # its running instances, on demand (None: a type with no known price)
    mine: bool = False  # made by this AWS identity (from this home or another)
    in_flight: bool = False  # its `up` is still running

    @property
    def billable(self) -> bool:
        return self.per_hour is None or self.per_hour > 0

    def count(self) -> int:
        return sum(len(v) for v in self.resources.values())

    def summary(self) -> str:
        return ", ".join(f"{len(ids)} {kind}" for kind, ids in sorted(self.resources.items()))


YOURS_ELSEWHERE = "yours (this AWS identity), from another clustertool home"


def _verdict(found: census.Found, me: owner.Owner, force_owner: bool,
             any_home: bool = False) -> tuple[str, str, bool]:
    ours = bool(found.home) and me.matches(found.owner, found.home)
    if lease.live(found.lease):
        return KEEP, f"{lease.describe(found.lease)}: never swept", ours
    if ours:
        return DELETE, "this home's cluster whose state is gone", ours
    if not found.id:
        return DELETE, "no known cluster (made before cluster ids)", ours
    if found.lease == tags.DONE:
        if _mine(found, me):
            if any_home or force_owner:
                return DELETE, f"{YOURS_ELSEWHERE} ({'--any-home' if any_home else '--force-owner'})", ours
            return KEEP, f"{YOURS_ELSEWHERE} (--any-home deletes it)", ours
        if force_owner:
            return DELETE, "another owner's cluster (--force-owner)", ours
        return KEEP, "another owner's cluster (--force-owner deletes it)", ours
    return DELETE, f"another owner's {lease.describe(found.lease)}", ours


def _mine(found: census.Found, me: owner.Owner) -> bool:
    return bool(found.owner) and owner.principal(found.owner) == owner.principal(me.arn)


def find(region: str | None = None, profile: str | None = None, known_ids: Iterable[str] = (),
         known_names: Iterable[str] = (), force_owner: bool = False, any_home: bool = False,
         report: Reporter = silent) -> list[Swept]:
    """Clusters in the region that this home does not know (by id; by name for ones without id)."""
    aws = Aws(region=region, profile=profile, report=report)
    me = owner.caller(aws)
    ids, names = set(known_ids), set(known_names)
    out = []
    for found in census.collect(aws).values():
        if (found.id and found.id in ids) or (not found.id and found.name in names):
            continue
        action, why, ours = _verdict(found, me, force_owner, any_home)
        out.append(Swept(found.name, found.id, owner.describe(found.owner, found.home), found.age(),
                         lease.describe(found.lease), aws.region, dict(found.resources), action, why, ours, profile,
                         found.per_hour(), _mine(found, me), lease.live(found.lease)))
    return sorted(out, key=lambda s: (s.action != DELETE, s.name, s.id))


def delete(swept: list[Swept], report: Reporter = silent) -> list[Swept]:
    """Remove the clusters marked for deletion, instances first; returns those removed."""
    removed = []
    for item in swept:
        if item.action != DELETE:
            continue
        aws = Aws(region=item.region, profile=item.profile, report=report)
        pick = item.resources.get
        for line in filesystems_down.remove_found(aws, pick("efs-file-system", []), pick("fsx-file-system", []),
                                                  pick("security-group", []), silent):  # before the cluster's group
            report(f"{item.id or item.name}: {line}")
        owned = teardown.Owned(instances=pick("instance", []), placement_groups=pick("placement-group", []),
                               security_groups=pick("security-group", []), key_pairs=pick("key-pair", []),
                               network_interfaces=pick("network-interface", []), addresses=pick("address", []))
        for line in teardown.remove(aws, owned, silent):
            report(f"{item.id or item.name}: {line}")
        removed.append(item)
    return removed


def kept_line(swept: list[Swept]) -> str | None:
    """`kept 1 cluster running at $65.55/h: <id> (yours, from another clustertool home); --any-home deletes it`,
    for the finished clusters the sweep keeps that cost money (an `up` in flight is not counted)."""
    kept = [s for s in swept if s.action == KEEP and s.billable and not s.in_flight]
    if not kept:
        return None
    known = [s.per_hour for s in kept if s.per_hour is not None]
    rate = f"${sum(known):,.2f}/h" + (" and more (a type with no known price)" if len(known) < len(kept) else "")
    whose = ", ".join(f"{s.id or s.name} ({'yours, from another clustertool home' if s.mine else 'another owner'})"
                      for s in kept)
    flags = "--any-home deletes yours" if any(s.mine for s in kept) else ""
    flags += ("; " if flags else "") + "--force-owner deletes any" if any(not s.mine for s in kept) else ""
    word = "cluster" if len(kept) == 1 else "clusters"
    return f"kept {len(kept)} {word} running at {rate}: {whose}; {flags or '--force-owner deletes it'}"


def sweep(request: SweepRequest) -> Sweep:
    """`down --sweep` (the provider's hook): what :func:`find` found, as the table the CLI shows."""
    ids, names = request.known()
    found = find(region=request.region, profile=request.profile, known_ids=ids, known_names=names,
                 force_owner=request.force_owner, any_home=request.any_home, report=request.report)
    rows = [(o.name, o.id or "-", o.owner, short_age(o.age_s) if o.age_s is not None else "?", o.summary(),
             "?" if o.per_hour is None else f"{o.per_hour:,.2f}", f"{o.action}: {o.why}") for o in found]
    return Sweep("aws", "clusters no state of this clustertool home knows",
                 ["cluster", "id", "owner", "age", "resources", "$/h", "action"], rows, found,
                 [o for o in found if o.action == DELETE], kept_line(found), bills=True, unit="cluster(s)")


def remove(swept: Sweep, report: Reporter = silent) -> SweepRemoved:
    removed = delete(swept.to_delete, report=report)
    return SweepRemoved([f"{o.name} ({o.id or 'no id'}): {o.count()} resource(s)" for o in removed],
                        [(o.name, o.id) for o in removed if o.ours])
