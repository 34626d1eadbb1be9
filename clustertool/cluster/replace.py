"""`replace NODE…`: a new machine takes a node's name, role, index, slots, address and place in
the hostfiles; the old machine and what was on its disk are gone.

Under the cluster's lock: the provider makes each new node and removes the old one
(``Provider.replace_node``: all or nothing per node); the record then holds the new host key,
which `wire` pins here and pushes, with the cluster key and the known_hosts of every node, to
every node (each known_hosts is written whole, so the old key is gone from all of them) and
writes the leader's ~/hostfile; this machine's hostfile is written again.  A cordon on a
replaced node is lifted: the bad machine it marked is gone.  A replaced leader gets the autostop
watcher again (it lived on the old disk).

Machines clustertool did not make (static / adopted) are never replaced: `cordon` is the way
to keep a bad one out of jobs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from clustertool.cluster import autostop, monitoring, slurmup
from clustertool.cluster.cordon import write_local_hostfile
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.wiring import close_masters, wire
from clustertool.core import interrupts, nodeset, state
from clustertool.core.errors import NotSupported, ToolError, UsageError
from clustertool.core.model import ClusterRecord, ClusterState, Node, jsonable
from clustertool.remote.keys import fingerprint
from clustertool.sharedfs import mount

DISK_GONE = "what was on the old disk (home, /scratch, /tmp) is gone: copy datasets back with `clustertool copy`"


@dataclass
class ReplacedNode:
    node: str
    role: str
    address: str
    old_host_key: str | None  # SHA256 fingerprints
    new_host_key: str | None
    seconds: float
    cordon_lifted: bool = False
    old_instance: str | None = None  # cloud providers: the old machine's id (terminated, or kept with --keep-old)
    new_instance: str | None = None
    kept_old: bool = False  # --keep-old: the old machine is stopped and kept, not removed


@dataclass
class ReplaceResult:
    """What `replace` did (``to_dict()`` is its --json)."""

    cluster: str
    replaced: list[ReplacedNode] = field(default_factory=list)
    hostfile: str | None = None
    seconds: float = 0.0
    disk: str = DISK_GONE

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def targets(record: ClusterRecord, selection: str, owns: bool) -> list[Node]:
    """The nodes to replace, or one clear refusal (machines we did not make, a cluster not ready)."""
    if not selection.strip():
        raise UsageError("no node given", hint="e.g. clustertool replace node-3 --yes")
    if not owns:
        raise NotSupported(
            f"cluster {record.name!r} is made of machines clustertool did not make ({record.provider}): "
            "it cannot replace them",
            hint=f"`clustertool cordon {selection}` keeps a bad one out of hostfiles and jobs")
    if record.status != ClusterState.READY and not (record.no_ssh and record.status == ClusterState.PROVISIONED):
        raise UsageError(f"cluster {record.name!r} is {record.status}: replace needs a ready cluster",
                         hint=f"`clustertool start -c {record.name}` first")
    return nodeset.select(record, selection)


def replace(session: ClusterSession, selection: str, *, keep_old: bool = False) -> ReplaceResult:
    """Replace the selected nodes (each all or nothing), then pin, wire and write hostfiles once (a cluster
    brought up with --no-ssh: hostfiles only).  ``keep_old``: the provider keeps the old machine stopped."""
    t0, report = time.monotonic(), session.report
    with session.locked(purpose="replace") as record:
        provider = session.provider
        picked = targets(record, selection, provider.owns_cluster(record))
        try:
            provider.confirm_owner(record, False, "replace")
        except interrupts.Terminated as exc:
            raise interrupts.Terminated(exc.signum, f"replace stopped by {interrupts.signal_name(exc.signum)} before "
                                                    "it made anything") from None
        # the replaced nodes' connections (every one, with the leader: members may ride on it) are opened again by
        # wire; the others stay, with what runs over them (a `run --follow` that replaces a lost node keeps its stream)
        close_masters(record if any(n.is_leader for n in picked) else dataclasses.replace(
            record, nodes=picked, options={k: v for k, v in record.options.items() if k != "jump"}))
        out = ReplaceResult(record.name)
        for node in picked:
            out.replaced.append(_replace_one(session, record, node, keep_old))
        out.hostfile = str(write_local_hostfile(record))
        if record.no_ssh:  # brought up with --no-ssh: nothing is wired (as `start` does)
            state.save(record)
            out.seconds = round(time.monotonic() - t0, 2)
            return out
        report("pinning the new host key(s); pushing the cluster key, known_hosts and hostfile to every node")
        try:
            wire(session)
        except ToolError as exc:
            raise ToolError(f"{exc.message} (the new node(s) {nodeset.fold(n.node for n in out.replaced)} are made "
                            "and their keys pinned here)",
                            hint=f"once every node answers, `clustertool repin -c {record.name}` pushes keys and "
                                 "hostfiles again") from exc
        if any(r.role == "leader" for r in out.replaced) and autostop.setting_of(record):
            report("installing the autostop watcher on the new leader")
            autostop.install(session, autostop.setting_of(record),
                             autostop.poweroff_command(provider))
        state.save(record)
        mount.mount_phase(session, record, report)  # new nodes: shared fs
        slurmup.after_replace(session, [r.node for r in out.replaced])  # Slurm's files, key and daemons
        for line in monitoring.restart_lines(session, "replace"):  # the new nodes' exporters, Prometheus's targets
            report(line)
    out.seconds = round(time.monotonic() - t0, 2)
    return out


def _replace_one(session: ClusterSession, record: ClusterRecord, node: Node, keep_old: bool = False) -> ReplacedNode:
    t = time.monotonic()
    session.report(f"replacing {node.name} ({node.role}, {node.address})")
    try:
        new = session.provider.replace_node(record, node.name, keep_old=keep_old)
    except (NotSupported, UsageError):  # refused before anything was touched
        raise
    except BaseException as exc:
        if record.node(node.name) is not node:  # the provider put the new node in the record, then was stopped
            record.node(node.name).extra["replaced"] = {"at": time.time(), "old_host_key": fingerprint(node.host_keys)}
            state.save(record)
            raise
        why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        record.node(node.name).extra["replace_failed"] = {"at": time.time(), "why": why,
                                                          "down": not session.provider.REPLACE_KEEPS_OLD}
        state.save(record)
        raise
    lifted = node.cordon is not None
    new.cordon = None
    new.extra.pop("replace_failed", None)
    new.extra["replaced"] = {"at": time.time(), "old_host_key": fingerprint(node.host_keys)}
    record.nodes[[n.name for n in record.nodes].index(node.name)] = new
    state.save(record)
    if lifted:
        session.report(f"{node.name}: its cordon is lifted (the machine it marked is gone)")
    session.report(f"{node.name}: replaced; {DISK_GONE}")
    return ReplacedNode(node.name, node.role, new.address, fingerprint(node.host_keys), fingerprint(new.host_keys),
                        round(time.monotonic() - t, 2), lifted, node.instance_id, new.instance_id,
                        keep_old and bool(node.instance_id))
