"""Find and remove local clusters whose state is gone (a killed `up`, a deleted state file).

Every bridge the local provider makes carries the alias
``clustertool:<cluster>:<token>:<home id>:<cluster id>``; a bridge whose (cluster, token) no state
file of this CLUSTERTOOL_HOME records is an orphan. Only this home's orphans are removed: another
home's cluster (another user, another test run on the same machine) is listed and kept unless
``force_owner``, as is a bridge made before bridges named their home. Removing one is the
provider's own teardown, driven by what the alias says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustertool.core import state
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord, Reporter, silent
from clustertool.providers.base import Sweep, SweepRemoved, SweepRequest
from clustertool.providers.local import net, sysops
from clustertool.providers.local.removal import teardown

DELETE, KEEP = "delete", "keep"


@dataclass
class LocalOrphan:
    kind: str
    id: str  # the bridge
    cluster: str
    region: str  # where it is: this machine
    token: str
    slot: int
    home: str | None = None  # the clustertool home that made it (None: made before bridges said)
    cluster_id: str | None = None
    action: str = DELETE
    why: str = ""

    @property
    def ours(self) -> bool:
        return self.home is not None and self.home == state.home_id()


@dataclass
class BridgeOwner:
    cluster: str
    token: str
    home: str | None = None
    cluster_id: str | None = None


def _known_tokens() -> set[tuple[str, str]]:
    known = set()
    for name in state.list_clusters():
        try:
            c = state.load(name)
        except ToolError:
            continue
        if c.provider == "local" and c.provider_state.get("token"):
            known.add((c.name, c.provider_state["token"]))
    return known


def parse_alias(alias: str) -> BridgeOwner | None:
    """Who made a bridge, from its alias (``clustertool:<cluster>:<token>[:<home>:<id>]``), else None."""
    parts = alias.split(":")
    if len(parts) not in (3, 5) or parts[0] != "clustertool" or not state.NAME_RE.match(parts[1]) or not parts[2]:
        return None
    if len(parts) == 3:
        return BridgeOwner(parts[1], parts[2])
    return BridgeOwner(parts[1], parts[2], parts[3] or None, None if parts[4] in ("", "-") else parts[4])


def _decide(owner: BridgeOwner, force_owner: bool) -> tuple[str, str]:
    if owner.home == state.home_id():
        return DELETE, "this home has no state for it"
    if force_owner:
        return DELETE, "--force-owner"
    if owner.home is None:
        return KEEP, "made before bridges named their owner; --force-owner removes it"
    return KEEP, f"another clustertool home's cluster (home {owner.home}); --force-owner removes it"


def find_orphans(force_owner: bool = False) -> list[LocalOrphan]:
    known = _known_tokens()
    orphans = []
    for bridge in sysops.bridge_names():
        match = net.BRIDGE_RE.match(bridge)
        try:
            alias = Path("/sys/class/net", bridge, "ifalias").read_text().strip()
        except OSError:
            continue
        owner = parse_alias(alias)
        if match and owner and (owner.cluster, owner.token) not in known:
            action, why = _decide(owner, force_owner)
            orphans.append(LocalOrphan("local cluster (bridge, namespaces, sshd)", bridge, owner.cluster,
                                       "this machine", owner.token, int(match.group(1)), owner.home,
                                       owner.cluster_id, action, why))
    return orphans


def delete_orphans(orphans: list[LocalOrphan], report: Reporter = silent) -> list[str]:
    removed = []
    for orphan in orphans:
        cluster = ClusterRecord(name=orphan.cluster, provider="local",
                          provider_state={"token": orphan.token, "slot": orphan.slot, "bridge": orphan.id})
        # files=False: a same-named cluster of this home may own the derived node directory
        # (the caller forgets this home's leftovers by the marker's cluster id)
        for line in teardown(cluster, files=False):
            report(f"{orphan.cluster}: {line}")
        removed.append(orphan.id)
    return removed


def sweep(request: SweepRequest) -> Sweep:
    """`down --sweep --provider local` (the provider's hook): the orphans, as the table the CLI shows."""
    if request.any_home:
        raise UsageError("--any-home is for --provider aws (a local cluster's home is this machine)")
    orphans = find_orphans(force_owner=request.force_owner)
    rows = [(o.cluster, o.cluster_id or "-", o.id, o.home or "?", f"{o.action}: {o.why}") for o in orphans]
    return Sweep("local", "local clusters no state of this clustertool home knows",
                 ["cluster", "id", "bridge", "home", "action"], rows, orphans,
                 [o for o in orphans if o.action == DELETE])


def remove(swept: Sweep, report: Reporter = silent) -> SweepRemoved:
    removed = delete_orphans(swept.to_delete, report=report)
    return SweepRemoved(removed, [(o.cluster, o.cluster_id) for o in swept.to_delete if o.ours])
