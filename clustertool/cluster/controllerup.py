"""The recovery controller in the cluster's life: `up --controller` gives it its rights and starts it, `status`
shows it, `down` stops it first (before the nodes go, else it would see them vanish and replace them), `down
--sweep` stops one whose cluster state is gone (controller/ has the pieces; this module wires them).

Where it runs: a detached process on this machine (cluster/controllerproc.py), with this machine's rights.
``cluster.options["controller"] = {"node": ...}``: with AWS's --controller-node, that node also gets an
instance profile scoped to the cluster (providers/aws/controller_iam.py), made inside up's rollback and removed
by `down` before the instances; the service that would run the controller there (so that it goes on with this
machine off) is not started by this version: `up` says so.
"""

from __future__ import annotations

from clustertool.cluster import controllerproc
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.model import ClusterRecord

KEY = "controller"  # in the record's options: {"node": None | name, "pid": ...}


def wanted(controller: bool, controller_node: str | None) -> bool:
    return bool(controller or controller_node)


def of(cluster: ClusterRecord) -> dict | None:
    """The cluster's controller setting (None: `up` started none)."""
    found = cluster.options.get(KEY)
    return found if isinstance(found, dict) else None


def start_at_up(session: ClusterSession, node: str | None) -> list[str]:
    """`up --controller` once the cluster is ready (its lock held, inside up's rollback): the rights (the
    provider's hook: on AWS with --controller-node, an instance profile on that node), recorded, then the process
    on this machine (not with --no-ssh: it watches the leader over SSH); the lines saying what was done."""
    cluster = session.record
    if node is not None:
        cluster.node(node)  # a name of the cluster (UsageError otherwise)
    cluster.options[KEY] = {"node": node}
    state.save(cluster)
    lines = session.provider.controller_identity(cluster, node, save=session.save)  # controller/identity.py's give
    if node is not None:
        lines.append(f"controller: rights given to {node}; the service on {node} is not started by this version: "
                     "the controller runs on this machine")
    if cluster.no_ssh:
        return lines + ["controller: not started (--no-ssh: it watches the jobs' leader over SSH)"]
    started = controllerproc.start(session)
    cluster.options[KEY] = {"node": node, "pid": started.pid}
    state.save(cluster)
    lines.append(f"controller: running on this machine (pid {started.pid}, log {started.log}): it replaces the "
                 "nodes that jobs run with --replace-failed lose")
    return lines


def stop_lines(session: ClusterSession | str) -> list[str]:
    """Stop the cluster's controller on this machine (idempotent): `down` first, up's rollback, a sweep."""
    stopped = controllerproc.stop(session, timeout=STOP_TIMEOUT_S)
    if stopped.pid is None:
        return []
    name = session if isinstance(session, str) else session.name
    return [f"controller of {name}: {stopped.how} (pid {stopped.pid})"]


STOP_TIMEOUT_S = 180.0  # a replacement in progress ends first (SIGTERM lets the round finish)


def status_extra(cluster: ClusterRecord) -> dict:
    """`status`'s ``controller`` line (nothing for a cluster without one; AWS's identity line is the provider's)."""
    line = controllerproc.status_line(cluster.name)
    if line is None and of(cluster) is None:
        return {}
    if line is None and cluster.no_ssh:
        return {"controller": "not started (--no-ssh: it watches the jobs' leader over SSH)"}
    return {"controller": line or "not running (`up --controller` starts it)"}
