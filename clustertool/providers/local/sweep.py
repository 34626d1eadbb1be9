"""Find and remove local clusters whose state is gone (a killed `up`, a deleted home).

Every bridge the local provider makes carries the alias ``clustertool:<cluster>:<token>``;
a bridge whose (cluster, token) no state file of this CLUSTERTOOL_HOME records is an orphan.
Removing one is the provider's own teardown, driven by what the alias says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustertool import state
from clustertool.errors import ToolError
from clustertool.model import Cluster, Reporter, silent
from clustertool.providers.local import net, sysops
from clustertool.providers.local.teardown import teardown


@dataclass
class LocalOrphan:
    kind: str
    id: str  # the bridge
    cluster: str
    region: str  # where it is: this machine
    token: str
    slot: int


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


def parse_alias(alias: str) -> tuple[str, str] | None:
    """(cluster, token) from a bridge alias ``clustertool:<cluster>:<token>``, else None."""
    parts = alias.split(":")
    if len(parts) == 3 and parts[0] == "clustertool" and state.NAME_RE.match(parts[1]) and parts[2]:
        return parts[1], parts[2]
    return None


def find_orphans() -> list[LocalOrphan]:
    known = _known_tokens()
    orphans = []
    for bridge in sysops.bridge_names():
        match = net.BRIDGE_RE.match(bridge)
        try:
            alias = Path("/sys/class/net", bridge, "ifalias").read_text().strip()
        except OSError:
            continue
        owner = parse_alias(alias)
        if match and owner and owner not in known:
            orphans.append(LocalOrphan("local cluster (bridge, namespaces, sshd)", bridge, owner[0],
                                       "this machine", owner[1], int(match.group(1))))
    return orphans


def delete_orphans(orphans: list[LocalOrphan], report: Reporter = silent) -> list[str]:
    removed = []
    for orphan in orphans:
        cluster = Cluster(name=orphan.cluster, provider="local",
                          provider_state={"token": orphan.token, "slot": orphan.slot, "bridge": orphan.id})
        # files=False: a same-named cluster of this home may own the derived node directory
        for line in teardown(cluster, files=False):
            report(f"{orphan.cluster}: {line}")
        removed.append(orphan.id)
    return removed
