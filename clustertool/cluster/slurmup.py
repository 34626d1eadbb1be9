"""Slurm on a cluster clustertool makes (`up --scheduler slurm`): the plan, the setup at `up`, and the
daemons kept alive through `stop`/`start`, `reboot` and `replace`.

The provider says where Slurm lives on its nodes (``Provider.slurm_placement``: a local node's private
folder and boot hook, stand-in GPUs; the packages and systemd units of a machine of its own); slurm/bringup.py
does the work.  What the record keeps (``ClusterRecord.scheduler``, slurm/slurminfo.py) is enough to write
the same slurm.conf again for a replaced node: each node's size, the timers, the layout.  Nothing here prints.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, Sequence

from clustertool.cluster.session import ClusterSession
from clustertool.cluster.spec import ClusterSpec
from clustertool.core import nodeset, state
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.providers.base import Provider, SlurmPlacement
from clustertool.remote.group import run_on_nodes
from clustertool.slurm import SlurmError, bringup, munge, nodescript, slurminfo
from clustertool.slurm.layout import Layout, private_layout, system_layout
from clustertool.slurm.slurmconf import NodeSize, SlurmSettings, Timers, conf_files, settings_for
from clustertool.slurm.slurminfo import SlurmInfo

TIMERS_ENV = "CLUSTERTOOL_SLURM_TIMERS"  # e.g. "slurmd_timeout=10,min_job_age=600": a test's shorter timers
AFTER_BOOT_S = 120.0  # how long nodes may take to be idle in sinfo again after a start, reboot or replace


def want(spec: ClusterSpec, cluster: ClusterRecord) -> None:
    """At `up`: the record asks for Slurm before anything is made (the AWS provider's user data reads it)."""
    if spec.scheduler == "slurm":
        cluster.scheduler = {"kind": slurminfo.KIND, "made": True, "ready": False,
                             "leader_compute": spec.leader_compute}


def wanted(cluster: ClusterRecord) -> bool:
    return bool(cluster.scheduler and cluster.scheduler.get("made", True) and slurminfo.wanted(cluster))


def check(provider: Provider, cluster: ClusterRecord, count: int | None) -> SlurmPlacement:
    """Before `up` makes anything: the provider can set Slurm up; a leader that does not compute leaves nodes."""
    placement = provider.slurm_placement(cluster)
    if not (cluster.scheduler or {}).get("leader_compute", True) and (count or 0) < 2:
        raise UsageError("--no-leader-compute needs 2 nodes or more: the leader runs only slurmctld",
                         hint="add nodes, or let the leader compute")
    timers()
    return placement


def plan_lines(provider: Provider, cluster: ClusterRecord) -> list[str]:
    placement = provider.slurm_placement(cluster)
    computes = "every worker, the leader too" if (cluster.scheduler or {}).get("leader_compute", True) \
        else "every worker but the leader"
    back = (f"the node's boot hook, {placement.boot_hook}" if placement.boot_hook
            else "systemd (the units are enabled)")
    return [
        f"slurm: {placement.release}",
        f"slurm: slurmctld on the leader, slurmd on {computes}; one partition of them (reduction servers are no "
        "Slurm nodes); sizes from each node's slurmd -C"
        + ("; stand-in GPUs, one per slot (character devices, no driver), as GRES"
           if placement.standin_gpus else "; GPUs as GRES (gpu:N, /dev/nvidia[0-N])"),
        "slurm: a munge key made here (0600 in the cluster's folder), sent to each node on its shell's stdin, 0400 "
        "there" + ("; one munged per node with the cluster's own key and socket, never this machine's /etc/munge"
                   if placement.private else ""),
        f"slurm: the daemons come back after stop/start, reboot and replace ({back}); up is ready once every node "
        "is idle in sinfo and srun -N<all> true runs",
    ]


def timers() -> Timers:
    """Slurm's timers: its defaults, or those ``CLUSTERTOOL_SLURM_TIMERS`` shortens (a test sees a death soon)."""
    text = os.environ.get(TIMERS_ENV, "").strip()
    values: dict[str, int] = {}
    known = set(Timers.__dataclass_fields__)
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition("=")
        if key not in known or not value.strip().isdigit():
            raise UsageError(f"{TIMERS_ENV}: {item!r} is not NAME=SECONDS", hint=f"names: {', '.join(sorted(known))}")
        values[key] = int(value)
    return Timers(**values)


def layout_for(placement: SlurmPlacement, user: str) -> Layout:
    home = "/root" if user == "root" else f"/home/{user}"
    return private_layout(home) if placement.private else system_layout()


def setup(session: ClusterSession) -> SlurmInfo:
    """`up`'s Slurm step, on a cluster that is up and wired: every node idle and ``srun -N<all> true`` run."""
    cluster, provider = session.record, session.provider
    placement = provider.slurm_placement(cluster)
    leader_compute = bool((cluster.scheduler or {}).get("leader_compute", True))
    key = munge.ensure_key(state.ClusterPaths(cluster.name).root)
    chosen = timers()
    settings = bringup.setup(session, key, layout=layout_for(placement, cluster.user), leader_compute=leader_compute,
                             standin_gpus=placement.standin_gpus, cgroups=placement.cgroups,
                             slurm_user=placement.slurm_user, timers=chosen, report=session.report,
                             boot_hook=placement.boot_hook, probe_timeout=placement.probe_timeout)
    found = SlurmInfo(settings.layout, controller=settings.controller, nodes=tuple(settings.node_names),
                      partition=settings.partition, release=settings.release, made=True,
                      leader_compute=leader_compute, standin_gpus=placement.standin_gpus,
                      gpus=max((n.gpus for n in settings.nodes), default=0))
    cluster.scheduler = {**found.to_dict(), **_kept(settings)}
    state.save(cluster)
    return found


def _kept(settings: SlurmSettings) -> dict[str, Any]:
    """What writing the same slurm.conf again needs (a replaced node): sizes, timers, cgroups, SlurmUser."""
    return {"sizes": {n.name: [*asdict(n.size).values(), n.gpus] for n in settings.nodes},
            "timers": asdict(settings.timers), "cgroups": settings.cgroups, "slurm_user": settings.slurm_user}


def settings_of(cluster: ClusterRecord, found: SlurmInfo,
                sizes: dict[str, tuple[NodeSize, int]] | None = None) -> SlurmSettings:
    """The cluster's settings as `up` wrote them (``sizes``: some nodes' new sizes)."""
    data = cluster.scheduler or {}
    known = {name: (NodeSize(*values[:6]), int(values[6])) for name, values in (data.get("sizes") or {}).items()}
    known.update(sizes or {})
    settings = settings_for(cluster, known, found.layout, leader_compute=found.leader_compute,
                            cgroups=bool(data.get("cgroups")), slurm_user=str(data.get("slurm_user") or "root"),
                            timers=Timers(**(data.get("timers") or {})))
    return settings


def _made(cluster: ClusterRecord) -> SlurmInfo | None:
    found = slurminfo.of(cluster)
    return found if found is not None and found.made and found.ready else None


def before_stop(session: ClusterSession, nodes: Sequence[Node] | None = None) -> list[str]:
    """slurmctld saves its queue, slurmd its state: the daemons stopped (TERM) before the machines go.  A
    systemd machine's own shutdown does it.  Returns what could not be stopped (the machines go anyway)."""
    found = _made(session.record)
    if found is None or found.layout.service == "systemd":
        return []
    return bringup.stop(session, found.layout, nodes)


def after_boot(session: ClusterSession, nodes: Sequence[Node] | None = None) -> None:
    """After `start` or `reboot`: the daemons the boot started (started now where they are not, which is
    idempotent), and every Slurm node of ``nodes`` idle again."""
    cluster = session.record
    found = _made(cluster)
    if found is None:
        return
    targets = list(nodes) if nodes is not None else cluster.ordered_nodes()
    names = {n.name for n in targets} & (set(found.nodes) | {found.controller})
    if found.layout.service != "systemd":
        ordered = [n for n in cluster.ordered_nodes() if n.name in names]
        for group in ([n for n in ordered if n.name == found.controller],
                      [n for n in ordered if n.name != found.controller]):
            _start(session, found.layout, group)
    computes = [n for n in found.nodes if n in names]
    session.report(f"slurm: waiting for {nodeset.fold(found.slurm_names(computes)) or 'the controller'} to be idle")
    bringup.wait_names_idle(session, found.layout, found.slurm_names(computes), found.controller, AFTER_BOOT_S)


def _start(session: ClusterSession, layout: Layout, nodes: list[Node]) -> None:
    if not nodes:
        return
    result = run_on_nodes(session, nodes, bringup.root_shell(session), timeout=60,
                          stdin_data=nodescript.start_script(layout).encode())
    for failed in result.failed():
        raise SlurmError(f"Slurm did not start again on {failed.node}: {failed.reason}",
                         hint=f"see {layout.log_dir}/start.log there")


def after_replace(session: ClusterSession, replaced: Sequence[str]) -> None:
    """New machines under old names: probed, given the cluster's files and key, started, idle again.  When a
    new machine's size differs, every node gets the new slurm.conf and slurmctld reads it again."""
    cluster = session.record
    found = _made(cluster)
    names = [n for n in replaced if found is not None and (n in found.nodes or n == found.controller)]
    if found is None or not names:
        return
    placement = session.provider.slurm_placement(cluster)
    nodes = [cluster.node(n) for n in names]
    probes = bringup.probe(session, nodes, found.layout, placement.standin_gpus, timeout=placement.probe_timeout)
    sizes = {p.node: (p.size, p.gpus) for p in probes.values() if p.node in found.nodes}
    before = settings_of(cluster, found)
    settings = settings_of(cluster, found, sizes)
    key = munge.ensure_key(state.ClusterPaths(cluster.name).root)
    changed = conf_files(settings) != conf_files(before)
    session.report(f"slurm: {nodeset.fold(names)} get the cluster's key and config"
                   + (" (a new size: every node's slurm.conf is written again)" if changed else ""))
    if changed:
        others = [n.name for n in cluster.ordered_nodes() if n.name not in names]
        bringup.install(session, settings, key, standin_gpus=placement.standin_gpus, only=others,
                        boot_hook=placement.boot_hook, start=False)
    bringup.install(session, settings, key, standin_gpus=placement.standin_gpus, only=names,
                    boot_hook=placement.boot_hook, report=session.report)
    if changed:
        result = bringup.run_slurm(session, cluster.leader, found.layout, ["scontrol", "reconfigure"])
        if not result.ok:
            raise SlurmError(f"scontrol reconfigure failed on the leader: {result.reason}")
    cluster.scheduler = {**(cluster.scheduler or {}), **_kept(settings)}
    state.save(cluster)
    computes = [n for n in names if n in found.nodes]
    bringup.wait_names_idle(session, found.layout, found.slurm_names(computes), found.controller, AFTER_BOOT_S)


def admin_command(cluster: ClusterRecord, found: SlurmInfo, argv: list[str]) -> str:
    """The remote line of a Slurm command only an operator may run (drain, resume): as root on a cluster
    clustertool made (its user may be another, with sudo), as the user on an adopted one."""
    line = bringup.slurm_command(found.layout, argv)
    return f"sudo -n {line}" if found.made and cluster.user != "root" else line

