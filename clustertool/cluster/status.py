"""`status` and `ls`: a cluster's nodes as its provider sees them now, and the clusters this
machine knows (split from lifecycle.py, which brings clusters up and down)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clustertool.cluster import autostop, blockend, controllerup, monitoring, topology_order
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, ClusterState, jsonable
from clustertool.providers.base import Provider, get_provider
from clustertool.remote import access
from clustertool.remote.group import run_on_nodes
from clustertool.remote.keys import fingerprint
from clustertool.sharedfs import mount
from clustertool.slurm import slurminfo


@dataclass
class NodeStatus:
    node: str
    role: str
    address: str
    slots: int
    state: str
    reachable: bool | None
    detail: str = ""
    cordon: dict | None = None  # `clustertool cordon`: {"reason", "since", "by"}; None: not cordoned
    host_key: str | None = None  # SHA256 fingerprint of the pinned host key (None: not pinned yet)


@dataclass
class ClusterStatus:
    cluster: ClusterRecord
    nodes: list[NodeStatus]
    extra: dict = field(default_factory=dict)  # what the provider adds (instance type, price, cost so far)

    @property
    def unreachable(self) -> list[str]:
        return [r.node for r in self.nodes if r.reachable is False]

    def to_dict(self) -> dict:
        """What `status --json` prints."""
        c = self.cluster
        return {"cluster": c.name, "provider": c.provider, "status": c.status, "hostfile": c.hostfile_path,
                "nodes": jsonable(self.nodes), **jsonable(self.extra), "topology_groups": topology_order.groups(c)}


def status(session: ClusterSession, *, check_ssh: bool = True, timeout: float = 10.0) -> ClusterStatus:
    """Nodes as the provider sees them now; a provider that cannot be reached is an error.

    Of a cluster whose `up` did not finish (killed, or its rollback failed) the nodes are what
    the provider finds by the cluster's id, not the (possibly empty) list the state recorded."""
    cluster, provider, report = session.reload(), session.provider, session.report
    queried = provider.query_instances(cluster)
    unfinished = cluster.status in (ClusterState.PROVISIONING, ClusterState.FAILED)
    if unfinished:
        cluster.nodes = queried  # shown, not saved
    for line in autostop.reconcile_locked(cluster, provider, queried):
        report(line)
    states = {n.name: n.state for n in queried}
    reach: dict[str, tuple[bool, str]] = {}
    if check_ssh and cluster.status == ClusterState.READY:
        for r in run_on_nodes(session, cluster.nodes, "true", timeout=timeout).results:
            reach[r.node] = (r.ok, r.reason)
    rows = [
        NodeStatus(n.name, n.role, n.address, n.slots, states.get(n.name, "missing"),
                   reach.get(n.name, (None, ""))[0], reach.get(n.name, (None, ""))[1], n.cordon,
                   fingerprint(n.host_keys))
        for n in cluster.ordered_nodes()
    ]
    extra = provider.describe(cluster)
    extra["access"] = access.describe(cluster)
    extra.update(autostop.status_extra(session, check_ssh))
    extra.update(mount.status_extra(session, cluster, check_ssh))
    extra.update(blockend.status_extra(session, check_ssh))  # when the machines go; jobs warned of it
    extra.update(monitoring.status_extra(cluster))  # Prometheus on the leader, while on
    extra.update(controllerup.status_extra(cluster))  # the recovery controller: running, what it last saw
    if unfinished:
        extra["up"] = _unfinished(cluster, provider)
        wait = provider.up_waiting(cluster) if cluster.status == ClusterState.PROVISIONING else None
        if wait:
            extra["capacity_wait"] = wait.record  # --json; the text is in "up"
    extra.update(replacements(cluster))
    extra.update(topology_order.status_extra(cluster))  # nodes by network node, where `up` learned them
    extra.update(slurm_extra(cluster))
    return ClusterStatus(cluster, rows, extra)


def slurm_extra(cluster: ClusterRecord) -> dict:
    """``slurm``: the release, partition and controller of the cluster's Slurm, in one line (none without)."""
    found = slurminfo.of(cluster)
    if found is None:
        return {"slurm": "packages only: set up never ran (up --no-ssh)"} if slurminfo.wanted(cluster) else {}
    how = f"slurmctld on {found.controller}" if found.made else "adopted: its config and daemons are the site's"
    return {"slurm": f"{found.release}, partition {found.partition or 'default'} of {found.hostlist()}; {how}"}


def _unfinished(cluster: ClusterRecord, provider: Provider) -> str:
    held = state.holder(cluster.name)
    if held and held[1] == "up":
        line = waiting(cluster, provider=provider)
        return f"in progress (pid {held[0]})" + (f"; {line}" if line else "")
    live = [n for n in cluster.nodes if n.state not in ("terminated", "missing")]
    gone = cluster.status == ClusterState.PROVISIONING
    what = "did not finish (its process is gone)" if gone else "and its cleanup failed"
    return (f"{what}: {len(live)} node(s) still exist; `clustertool down -c {cluster.name} --yes` removes them "
            "and everything else it made")


def waiting(cluster: ClusterRecord, short: bool = False, provider: Provider | None = None) -> str | None:
    """What an `up --retry-until-up` in flight is doing: waiting for capacity (attempt N, next try at T)."""
    if cluster.status != ClusterState.PROVISIONING:
        return None
    wait = (provider or get_provider(cluster.provider)).up_waiting(cluster)
    return None if wait is None else wait.short if short else wait.line


def replacements(cluster: ClusterRecord, now: float | None = None) -> dict[str, str]:
    """A status line per node `replace` made (or failed to make), with the host key pinned now."""
    out = {}
    now = time.time() if now is None else now
    for n in cluster.ordered_nodes():
        failed, done = n.extra.get("replace_failed"), n.extra.get("replaced")
        if failed:
            left = "the node is down" if failed.get("down", True) else "the node is unchanged (its old machine runs)"
            out[f"{n.name} replace"] = (f"FAILED {now - failed['at']:.0f}s ago ({failed['why']}); {left}: "
                                        f"`clustertool replace {n.name}` again")
        elif done:
            out[f"{n.name} replaced"] = (f"{now - done['at']:.0f}s ago; host key {fingerprint(n.host_keys)} pinned "
                                         f"(was {done.get('old_host_key')})")
    return out


def list_all() -> list[ClusterRecord]:
    out = []
    for name in state.list_clusters():
        try:
            out.append(state.load(name))
        except ToolError:
            continue
    return out
