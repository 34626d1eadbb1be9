"""`status` and `ls`: a cluster's nodes as its provider sees them now, and the clusters this
machine knows (split from lifecycle.py, which brings clusters up and down)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.cluster import autostop
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, jsonable
from clustertool.remote import access
from clustertool.remote.group import run_on_nodes


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
                "nodes": jsonable(self.nodes), **jsonable(self.extra)}


def status(session: ClusterSession, *, check_ssh: bool = True, timeout: float = 10.0) -> ClusterStatus:
    """Nodes as the provider sees them now; a provider that cannot be reached is an error.

    Of a cluster whose `up` did not finish (killed, or its rollback failed) the nodes are what
    the provider finds by the cluster's id, not the (possibly empty) list the state recorded."""
    cluster, provider, report = session.reload(), session.provider, session.report
    queried = provider.query_instances(cluster)
    unfinished = cluster.status in ("provisioning", "failed")
    if unfinished:
        cluster.nodes = queried  # shown, not saved
    for line in autostop.reconcile_locked(cluster, provider, queried):
        report(line)
    states = {n.name: n.state for n in queried}
    reach: dict[str, tuple[bool, str]] = {}
    if check_ssh and cluster.status == "ready":
        for r in run_on_nodes(session, cluster.nodes, "true", timeout=timeout).results:
            reach[r.node] = (r.ok, r.reason)
    rows = [
        NodeStatus(n.name, n.role, n.address, n.slots, states.get(n.name, "missing"),
                   reach.get(n.name, (None, ""))[0], reach.get(n.name, (None, ""))[1], n.cordon)
        for n in cluster.ordered_nodes()
    ]
    extra = provider.describe(cluster)
    extra["access"] = access.describe(cluster)
    extra.update(autostop.status_extra(session, check_ssh))
    if unfinished:
        extra["up"] = _unfinished(cluster)
    return ClusterStatus(cluster, rows, extra)


def _unfinished(cluster: ClusterRecord) -> str:
    held = state.holder(cluster.name)
    if held and held[1] == "up":
        return f"in progress (pid {held[0]})"
    live = [n for n in cluster.nodes if n.state not in ("terminated", "missing")]
    what = "did not finish (its process is gone)" if cluster.status == "provisioning" else "and its cleanup failed"
    return (f"{what}: {len(live)} node(s) still exist; `clustertool down -c {cluster.name} --yes` removes them "
            "and everything else it made")


def list_all() -> list[ClusterRecord]:
    out = []
    for name in state.list_clusters():
        try:
            out.append(state.load(name))
        except ToolError:
            continue
    return out
