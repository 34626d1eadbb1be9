"""Bring clusters up and down: provider verbs, then keys, known_hosts, hostfiles.

`up` is all or nothing: any failure (or Ctrl-C, SIGTERM, SIGHUP) after the provider made
something runs the provider's teardown before the error reaches the user, and the state is
kept only when that teardown itself failed (so `down` can finish the job).  One `up` per name
per home: the lock is taken first and the name checked under it.  Every cluster gets an id
(name + random suffix) that teardown goes by.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from clustertool.cluster import autostop, ledger, monitoring, slurmadopt, slurmup, sshinclude, topology_order
from clustertool.cluster.clusterrequests import DownRequest, UpRequest
from clustertool.cluster.controllerup import start_at_up, stop_lines
from clustertool.cluster.monitoring import MonitoringRequest, MonitoringResult
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.spec import ClusterSpec
from clustertool.cluster.status import list_all
from clustertool.cluster.wiring import close_masters, unwire, wire, write_hostfile
from clustertool.core import interrupts, state
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord, ClusterState, Reporter, jsonable, silent
from clustertool.providers.base import Provider, ProvisionRequest, get_provider
from clustertool.remote import keys
from clustertool.sharedfs import mount


@dataclass
class UpResult:
    cluster: ClusterRecord | None
    hostfile: Path | None = None
    plan: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    monitoring: MonitoringResult | None = None  # up --monitoring: what runs where, and any problem

    def to_dict(self) -> dict[str, Any]:
        """What `up --json` prints: the plan (a dry run), else the cluster, its hostfile and timings (and with
        --monitoring, what the stack's start said)."""
        if self.cluster is None:
            return {"plan": self.plan}
        out = {"cluster": self.cluster.to_dict(), "hostfile": jsonable(self.hostfile), "timings": self.timings}
        if self.monitoring is not None:
            out["monitoring"] = self.monitoring.to_dict()
        return out


def _new_session(spec: ClusterSpec, report: Reporter) -> ClusterSession:
    """The session `up` makes: a new record (its id: the name and a random suffix), the spec's provider."""
    provider = get_provider(spec.provider, report=report)
    cluster = ClusterRecord(
        name=spec.name, provider=spec.provider, user=spec.user or provider.default_user,
        options=dict(spec.options), created=time.time(), id=f"{spec.name}-{secrets.token_hex(3)}",
    )
    if spec.autostop:
        cluster.autostop = dict(spec.autostop)
    slurmup.want(spec, cluster)
    return ClusterSession(cluster, report=report, provider=provider)


def _already(name: str) -> ToolError:
    held = state.holder(name)
    if held and held[1] == "up":  # the state exists because that `up` is making it
        return state.being_created(name, held[0])
    return UsageError(f"cluster {name!r} already exists", hint=f"use it (-c {name}), give this one another --name, "
                                                               f"or `clustertool down -c {name}` first")


def up(request: UpRequest, *, report: Reporter = silent) -> UpResult:
    """`clustertool up`: all or nothing (see the module's docstring); the session it makes reports to
    ``report``.  A dry run makes nothing and returns the plan."""
    session = _new_session(request.spec, report)
    cluster, provider = session.record, session.provider
    if request.no_ssh:
        cluster.no_ssh = True  # providers wait for "running", not for SSH
    paths = state.ClusterPaths(cluster.name)

    def save() -> None:
        state.save(cluster)

    # ProvisionRequest.count says int, yet a provider that counts what it adopts gets None (static, aws adopt):
    # the providers' own types need that fixed; the value passed on is unchanged
    provision = ProvisionRequest(cluster=cluster, count=cast(int, request.spec.nodes), slots=request.spec.slots,
                                 public_key="", key_path=paths.key, files_dir=paths.root,
                                 save=save, report=report, dry_run=request.dry_run)
    if state.exists(cluster.name):  # refused without touching the home; checked again under the lock
        raise _already(cluster.name)
    setting = autostop.setting_of(cluster)
    if setting:
        autostop.check_allowed(cluster, provider, setting)
    mount.check_kinds(provider, cluster)
    _check_slurm(session, request)
    if request.dry_run:
        provider.check(provision)
        plan = provider.plan(provision) + mount.plan_lines(cluster)
        plan += slurmup.plan_lines(provider, cluster) if slurmup.wanted(cluster) else []
        plan += [autostop.plan_line(setting, cluster.provider)] if setting else []
        plan += [f"start the recovery controller ({request.controller_node or 'on this machine'})"] \
            if request.wants_controller else []
        watch = MonitoringRequest.of(request.spec.monitoring)
        return UpResult(None, plan=plan + ([monitoring.plan_line(watch)] if watch and not request.no_ssh else []))
    with state.locked(cluster.name, purpose="up"):
        if state.exists(cluster.name):  # under the lock: a second `up` of the name makes nothing
            raise _already(cluster.name)
        try:
            provider.check(provision)
            keys.ensure_keypair(cluster.name, provider.key_type or keys.KEYGEN_TYPE)
            provision.public_key = paths.pubkey.read_text().strip()
            state.save(cluster)
            state.write_marker(cluster.name, cluster.id)
        except interrupts.Terminated as exc:  # nothing made yet: nothing to remember
            state.delete(cluster.name)
            raise interrupts.Terminated(exc.signum, f"up stopped by {interrupts.signal_name(exc.signum)} before "
                                                    "it made anything") from None
        result = _provision(session, provision, request.no_ssh,
                            (request.controller_node,) if request.wants_controller else None)
        watch = MonitoringRequest.of(request.spec.monitoring)
        if watch is not None and not request.no_ssh:
            result.monitoring = _start_monitoring(session, watch)
        return result


def _start_monitoring(session: ClusterSession, request: MonitoringRequest) -> MonitoringResult:
    """`up --monitoring`, once the cluster is up (its lock still held): the stack on every node; its problems are
    reported and leave the cluster up, without monitoring recorded as on (`monitoring enable` tries again)."""
    session.report("starting monitoring: the node exporter on every node, Prometheus on the leader")
    try:
        result = monitoring.start(session, request)
    except ToolError as exc:
        result = MonitoringResult(session.name, "enable", problems=[exc.message])
    for line in result.problems:
        session.report(f"monitoring: {line}")
    session.record.monitoring = None if result.problems else request.to_dict()
    state.save(session.record)
    return result


def _check_slurm(session: ClusterSession, request: UpRequest) -> None:
    """Slurm made (--scheduler slurm) or adopted (--slurm-login): what `up` can know before making anything."""
    cluster = session.record
    if slurmup.wanted(cluster):
        slurmup.check(session.provider, cluster, request.spec.nodes)
    if slurmadopt.adopting(cluster):
        if request.no_ssh:
            raise UsageError("--slurm-login reads the Slurm cluster over SSH: leave out --no-ssh")
        slurmadopt.layout_of(cluster.options)


def _slurm_phase(session: ClusterSession, slots: int | None) -> None:
    """Slurm adopted (its nodes join the record, wired like the login node) or set up on the nodes."""
    cluster = session.record
    if slurmadopt.adopting(cluster):
        session.report("reading the Slurm cluster's nodes from the login node")
        slurmadopt.adopt(session, slots)
        wire(session)
        write_hostfile(cluster)
        state.save(cluster)
    elif slurmup.wanted(cluster):
        session.report("setting Slurm up (munge, slurmctld, slurmd)")
        slurmup.setup(session)


def _provision(session: ClusterSession, request: ProvisionRequest, no_ssh: bool,
               controller: tuple[str | None] | None = None) -> UpResult:
    cluster, provider, report = session.record, session.provider, session.report
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        report(f"provisioning {request.count or ''} node(s) with the {cluster.provider} provider (id {cluster.id})")
        cluster.nodes = provider.run_instances(request)
        state.save(cluster)
        mount.provide(provider, request)
        timings["provision"] = time.monotonic() - t0
        report("waiting for nodes to answer SSH" if not no_ssh else "waiting for instances")
        cluster.nodes = provider.wait_instances(cluster)
        topology_order.arrange(cluster, provider, report)  # adjacent ranks under one network node, where known
        state.save(cluster)
        timings["wait"] = time.monotonic() - t0 - timings["provision"]
        path = write_hostfile(cluster)
        state.write_marker(cluster.name, cluster.id, str(path.resolve()))
        if not no_ssh:
            t1 = time.monotonic()
            report("pinning host keys and wiring cluster SSH")
            wire(session)
            timings["wire"] = time.monotonic() - t1
            mount.mount_phase(session, cluster, report)
            t2 = time.monotonic()
            _slurm_phase(session, request.slots)
            if cluster.scheduler:
                timings["slurm"] = time.monotonic() - t2
        elif slurmup.wanted(cluster):
            report("slurm: packages only (--no-ssh: nothing configures them over SSH)")
        autostop.install_at_up(cluster, provider, no_ssh, report)
        provider.finish(cluster)
        cluster.status = ClusterState.READY if not no_ssh else ClusterState.PROVISIONED
        state.save(cluster)
        if controller is not None:  # up --controller (its node: None, this machine), still inside the rollback
            _report_lines(report, start_at_up(session, controller[0]))
    except BaseException as exc:
        _rollback(session, exc)
        if isinstance(exc, interrupts.Terminated):
            raise interrupts.Terminated(exc.signum, f"up stopped by {interrupts.signal_name(exc.signum)}; "
                                                    "everything it had made was removed") from None
        raise
    sshinclude.install(report)
    ledger.record("up", cluster)
    timings["total"] = time.monotonic() - t0
    return UpResult(cluster, hostfile=path, timings=timings)


def _rollback(session: ClusterSession, exc: BaseException) -> None:
    cluster, provider, report = session.record, session.provider, session.report
    why = exc.message if isinstance(exc, (ToolError, interrupts.Terminated)) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        why = "interrupted (Ctrl-C)"
    report(f"up failed ({why}); removing what was made")
    try:
        _report_lines(report, stop_lines(cluster.name))
        for line in provider.terminate_instances(cluster):
            report(line)
    except BaseException as cleanup_exc:  # keep state so `down` can finish
        cluster.status = ClusterState.FAILED
        state.save(cluster)
        raise ToolError(
            f"up failed ({why}) and the cleanup failed too: {cleanup_exc}",
            hint=f"run `clustertool down -c {cluster.name} --yes` to finish removing resources",
        ) from exc
    _forget(cluster)


def _forget(cluster: ClusterRecord) -> None:
    close_masters(cluster)
    if cluster.hostfile_path:
        Path(cluster.hostfile_path).unlink(missing_ok=True)
    state.delete(cluster.name)


UP_ROLLBACK_WAIT_S = 900.0  # how long `down` waits for an `up` it stopped to roll back


def up_in_flight(name: str) -> int | None:
    """The pid of this home's `up` of ``name`` that is running now, when it is this user's own
    (a process of another user, or of another home, is not ours to stop)."""
    held = state.holder(name)
    if not held or held[1] != "up" or held[0] <= 0 or not state.alive(held[0]):
        return None
    try:
        if os.stat(f"/proc/{held[0]}").st_uid != os.getuid():
            return None
    except OSError:
        return None
    return held[0]


def stop_up(name: str, pid: int, *, report: Reporter = silent, wait_s: float = UP_ROLLBACK_WAIT_S) -> str:
    """SIGTERM the `up` making ``name`` (it rolls back what it made, as on Ctrl-C) and wait for it to end.
    Returns what happened, in one line."""
    report(f"stopping the `up` of {name!r} in flight (pid {pid}): it rolls back what it made")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"the `up` of {name!r} (pid {pid}) had already ended"
    started = time.monotonic()
    said = started
    while state.alive(pid):
        now = time.monotonic()
        if now - started > wait_s:
            raise ToolError(f"the `up` of {name!r} (pid {pid}) is still rolling back after {wait_s:g}s",
                            hint=f"wait for it to end, then `clustertool down -c {name} --yes` again")
        if now - said >= 10:
            report(f"waiting for the `up` (pid {pid}) to roll back ({now - started:.0f}s)")
            said = now
        time.sleep(0.2)
    return f"stopped the `up` of {name!r} (pid {pid}) after {time.monotonic() - started:.1f}s of rollback"


def down(session: ClusterSession, request: DownRequest = DownRequest()) -> list[str]:
    """Remove everything the cluster made (by its id); forget machines it adopted. Idempotent.

    A SIGTERM/SIGHUP lets the delete in progress finish, then stops with the state kept, so a
    second `down` completes the job."""
    name, report = session.name, session.report
    stopped = stop_lines(session)  # first: a controller that sees the nodes go would replace them
    with session.locked(purpose="down") as cluster:
        provider = session.provider
        lines: list[str] = _report_lines(report, stopped)
        if request.terminate_adopted:
            cluster.terminate_adopted = True
        cluster.keep_shared_fs = request.keep_shared_fs  # the file systems `up` made stay (the provider says what)
        try:
            with interrupts.deferred():
                _confirm_owner(provider, cluster, request.force_owner, "down")
                if autostop.setting_of(cluster) and cluster.status in autostop.UP:
                    lines += autostop.reconcile(cluster, provider, provider.query_instances(cluster))
                if cluster.status == ClusterState.READY:  # before the nodes go: no mount or sshfs left behind
                    lines += mount.unmount_phase(session, cluster, report)
                    lines += _report_lines(report, monitoring.stop_lines(session, _owns(provider, cluster)))
                if not _owns(provider, cluster) and cluster.nodes and cluster.status == ClusterState.READY:
                    lines += unwire(session)
                close_masters(cluster)
                for line in provider.terminate_instances(cluster):
                    report(line)
                    lines.append(line)
        except interrupts.Terminated as exc:
            raise interrupts.Terminated(exc.signum, f"down stopped by {interrupts.signal_name(exc.signum)} after "
                                                    "its current step; the state is kept",
                                        hint=f"run `clustertool down -c {name} --yes` again to finish") from None
        if cluster.status not in (ClusterState.AUTODOWNED, ClusterState.PROVISIONING, ClusterState.FAILED):
            ledger.record("down", cluster)
        _forget(cluster)
        lines.append(f"cluster {name!r} forgotten")
        sshinclude.tidy(report)  # this home's last cluster: its Include goes
        return lines


def _confirm_owner(provider: Provider, cluster: ClusterRecord, force: bool, verb: str) -> None:
    provider.confirm_owner(cluster, force, verb)


def forget_leftovers(name: str, cluster_id: str) -> list[str]:
    """After a sweep removed cluster ``cluster_id``: its key, lock and hostfile on this machine, when
    no state of this home names the cluster and its marker says they are that cluster's."""
    if not cluster_id or state.exists(name) or state.read_marker(name).get("id") != cluster_id:
        return []
    hostfile = state.read_marker(name).get("hostfile")
    lines = [f"{name}: removed the local key, lock and files of {cluster_id}"]
    ledger.record_gone(name, cluster_id)
    if hostfile and Path(hostfile).exists():
        Path(hostfile).unlink()
        lines.append(f"{name}: removed hostfile {hostfile}")
    state.delete(name)
    return lines


def known() -> tuple[set[str], set[str]]:
    """(ids, names) of the clusters this home has state for; names count for states without an id."""
    clusters = list_all()
    return {c.id for c in clusters if c.id}, {c.name for c in clusters}


def _owns(provider: Provider, cluster: ClusterRecord) -> bool:
    """Whether down terminates the machines (False for adopted / static ones)."""
    return provider.owns_cluster(cluster)


def stop(session: ClusterSession, *, force_owner: bool = False) -> None:
    """Stop the nodes, keeping their disks (shared filesystems unmounted first)."""
    with session.locked(purpose="stop") as cluster:
        provider = session.provider
        _confirm_owner(provider, cluster, force_owner, "stop")
        if cluster.status == ClusterState.READY:
            mount.unmount_phase(session, cluster, session.report)
            for line in slurmup.before_stop(session):
                session.report(f"slurm: not stopped before the machines: {line}")
            _report_lines(session.report, monitoring.stop_lines(session, _owns(provider, cluster)))
        close_masters(cluster)
        provider.stop_instances(cluster)
        was = cluster.status
        cluster.status = ClusterState.STOPPED
        for node in cluster.nodes:
            node.state = "stopped"
        state.save(cluster)
        if was != ClusterState.STOPPED:
            ledger.record("stop", cluster)


def start(session: ClusterSession, *, force_owner: bool = False) -> ClusterRecord:
    """Start stopped nodes; addresses may change, so hostfile, config and keys are refreshed."""
    with session.locked(purpose="start") as cluster:
        provider = session.provider
        _confirm_owner(provider, cluster, force_owner, "start")
        cordons = {n.name: n.cordon for n in cluster.nodes}  # a provider may hand back new Node objects
        cluster.nodes = provider.start_instances(cluster)
        cluster.nodes = provider.wait_instances(cluster)
        for node in cluster.nodes:
            node.cordon = node.cordon or cordons.get(node.name)
        write_hostfile(cluster)
        if cluster.no_ssh:  # brought up with --no-ssh: nothing to re-wire
            cluster.status = ClusterState.PROVISIONED
        else:
            wire(session)
            cluster.status = ClusterState.READY
            setting = autostop.setting_of(cluster)
            if setting or cluster.block_end:  # addresses may have changed; the idle count starts again
                autostop.install(session, setting, autostop.poweroff_command(provider))
        state.save(cluster)
        ledger.record("start", cluster)
        if cluster.status == ClusterState.READY:
            mount.mount_phase(session, cluster, session.report)
            slurmup.after_boot(session)
            _report_lines(session.report, monitoring.restart_lines(session, "start"))
        return cluster


def _report_lines(report: Reporter, lines: list[str]) -> list[str]:
    for line in lines:
        report(line)
    return lines
