"""Autostop / autodown, seen from this machine: the setting, the watcher's install, what it did.

The decision is the cluster's own (``nodeprogs/autostop.py`` on the leader, installed by
``nodeprogs/autostop.sh``), so a closed laptop still stops the bill.  This module builds its
config, installs or reconfigures it over SSH, reads back its idle time, and -- in ``reconcile``
-- notices a cluster that the watcher powered off: shown as autostopped / autodowned, written to
the ledger, and after an autodown the free leftovers (security group, placement group, key pair;
a local cluster's namespaces) removed.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass, field

from clustertool import nodeprogs
from clustertool.cluster import ledger
from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.durations import format_duration, parse_duration  # noqa: F401 - re-exported
from clustertool.core.errors import RemoteError, ToolError, UsageError
from clustertool.core.model import ClusterRecord, ClusterState, Node, Reporter, silent
from clustertool.providers.base import Provider, get_provider
from clustertool.remote.group import run_on_node

WAIT_FOR = ("jobs", "jobs-and-ssh")
# statuses of a cluster that is up (provisioned: brought up with --no-ssh)
UP = (ClusterState.READY, ClusterState.PROVISIONED)
INTERVAL_ENV = "CLUSTERTOOL_AUTOSTOP_INTERVAL"  # seconds between samples (hidden knob for tests)
DEFAULT_POWEROFF = 'if [ "$(id -u)" = 0 ]; then shutdown -h now; else sudo -n shutdown -h now; fi'


@dataclass
class Setting:
    idle_s: int
    down: bool = False
    wait_for: str = "jobs"

    def __post_init__(self) -> None:
        if self.wait_for not in WAIT_FOR:
            raise UsageError(f"invalid --wait-for {self.wait_for!r}", hint=f"choose {' or '.join(WAIT_FOR)}")

    @classmethod
    def from_dict(cls, data: dict | None) -> Setting | None:
        if not data or not data.get("idle_s"):
            return None
        return cls(int(data["idle_s"]), bool(data.get("down")), data.get("wait_for") or "jobs")

    def to_dict(self) -> dict:
        return {"idle_s": self.idle_s, "down": self.down, "wait_for": self.wait_for}

    def describe(self) -> str:
        what = "terminate (autodown)" if self.down else "stop"
        waits = "jobs, GPU use and interactive SSH sessions" if self.wait_for == "jobs-and-ssh" else "jobs and GPU use"
        return f"{what} every node after {format_duration(self.idle_s)} idle (counting {waits})"


def setting_of(cluster: ClusterRecord) -> Setting | None:
    return Setting.from_dict(cluster.autostop)


def plan_line(setting: Setting, provider: str) -> str:
    how = ("a systemd timer on the leader, else a supervised loop" if provider != "local"
           else "a supervised loop on the leader, restarted at every start")
    line = f"autostop: {setting.describe()}; decided on the leader ({how}), sampled every minute"
    if provider == "aws":
        line += ("; instances launch with InstanceInitiatedShutdownBehavior="
                 + ("terminate" if setting.down else "stop"))
    return line


def interval() -> int:
    try:
        return max(1, int(os.environ.get(INTERVAL_ENV) or 60))
    except ValueError:
        return 60


def watcher_config(cluster: ClusterRecord, setting: Setting | None, poweroff: str, now: float | None = None) -> dict:
    """The leader's config.json (``idle_s`` null: cancelled, the watcher only records)."""
    return {"cluster": cluster.name, "leader": cluster.leader.name,
            "members": [{"name": n.name, "address": n.address} for n in cluster.ordered_nodes() if not n.is_leader],
            "idle_s": setting.idle_s if setting else None, "down": bool(setting and setting.down),
            "wait_for": setting.wait_for if setting else "jobs", "interval_s": interval(),
            "poweroff": poweroff, "set_at": time.time() if now is None else now,
            "block_end": cluster.block_end}  # jobs are warned before the machines go (cluster/blockend.py)


def install_script(config: dict) -> str:
    program = (nodeprogs.DIR / "autostop.py").read_bytes()
    return nodeprogs.shell_script("autostop", MODE="install", PROGRAM_B64=base64.b64encode(program).decode(),
                                  CONFIG_B64=base64.b64encode(json.dumps(config).encode()).decode())


def install(session: ClusterSession, setting: Setting | None, poweroff: str) -> str:
    """Write the watcher and its config on the leader and make sure it runs; returns how it runs."""
    cluster = session.record
    script = install_script(watcher_config(cluster, setting, poweroff))
    result = run_on_node(session, cluster.leader, "sh -s", stdin_data=script.encode(), timeout=60)
    how = next((line.strip() for line in result.stdout.splitlines() if line.startswith(("watcher", "error"))), "")
    if not result.ok or not how.startswith("watcher"):
        detail = how or result.reason
        raise RemoteError(f"installing the autostop watcher on {cluster.leader.name} failed: {detail}",
                          hint="check that the leader has python3 (and sudo for systemd)")
    return how.split(" ", 1)[1]


@dataclass
class WatcherView:
    """What the leader's watcher says now."""

    config: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    poweroff: dict = field(default_factory=dict)
    blockend: dict = field(default_factory=dict)  # the jobs it warned of the block's end (cluster/blockend.py)
    log: list[str] = field(default_factory=list)

    def idle_for(self, now: float | None = None) -> float | None:
        since = self.state.get("idle_since")
        return None if since is None else max(0.0, (now or time.time()) - since)

    def to_dict(self) -> dict:
        return {"idle_s": self.idle_for(), "busy": self.state.get("busy", []), "checked": self.state.get("checked"),
                "notes": self.state.get("notes", []), "log": self.log, "poweroff": self.poweroff or None}


def parse_show(text: str) -> WatcherView:
    view = WatcherView()
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("config", "state", "poweroff", "blockend"):
            try:
                setattr(view, key, json.loads(rest) or {})
            except ValueError:
                pass
        elif key == "log":
            view.log.append(rest)
    return view


def read_watcher(session: ClusterSession, timeout: float = 10.0) -> WatcherView | None:
    """The watcher's config, idle time and log tail, read over SSH (None when the leader does not answer)."""
    cluster = session.record
    script = nodeprogs.shell_script("autostop", MODE="show", PROGRAM_B64="", CONFIG_B64="")
    result = run_on_node(session, cluster.leader, "sh -s", stdin_data=script.encode(), timeout=timeout)
    return parse_show(result.stdout) if result.ok else None


def status_extra(session: ClusterSession, check_ssh: bool) -> dict:
    """`status`'s autostop lines: the setting, the idle time (read from the leader), or when and why
    the watcher powered the cluster off."""
    cluster = session.record
    out: dict = {}
    if setting_of(cluster) or cluster.status == ClusterState.READY:
        ask = check_ssh and cluster.status == ClusterState.READY and setting_of(cluster) is not None
        out.update(status_lines(cluster, read_watcher(session) if ask else None))
    if cluster.status in (ClusterState.AUTOSTOPPED, ClusterState.AUTODOWNED):
        done = cluster.provider_state.get("autostopped") or {}
        out[cluster.status] = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(done.get("t", 0)))
                               + (f": {done['why']}" if done.get("why") else ""))
    return out


def install_at_up(cluster: ClusterRecord, provider: Provider, no_ssh: bool, report: Reporter = silent) -> None:
    """`up`'s step after wiring SSH: the watcher on the leader (a failure fails the `up`)."""
    setting = setting_of(cluster)
    if setting is None and not cluster.block_end:  # the watcher also warns jobs of a block's end
        return
    if no_ssh:
        report("autostop: the watcher needs SSH to the leader: not installed (--no-ssh); the setting "
               "only chooses what an OS shutdown does")
        return
    report("installing the autostop watcher on the leader" + ("" if setting else " (it warns jobs before the "
                                                                      "machines are taken back)"))
    how = install(ClusterSession(cluster, report=report), setting, poweroff_command(provider))
    report(f"autostop: {setting.describe() if setting else 'off'} ({how})")


def status_lines(cluster: ClusterRecord, view: WatcherView | None, now: float | None = None) -> dict:
    """What `status` adds: the setting and the idle time so far."""
    setting = setting_of(cluster)
    if setting is None:
        return {"autostop": "off"} if cluster.status == ClusterState.READY else {}
    out = {"autostop": setting.describe()}
    if cluster.status in (ClusterState.AUTOSTOPPED, ClusterState.AUTODOWNED):
        return out
    if cluster.status == ClusterState.PROVISIONED:
        out["idle"] = "not watched: brought up with --no-ssh, so no watcher runs on the leader"
    elif view is None:
        out["idle"] = "unknown (the leader did not answer)"
    elif (idle := view.idle_for(now)) is not None:
        out["idle"] = f"{format_duration(idle)} so far (stops at {format_duration(setting.idle_s)})"
    elif view.state.get("busy"):
        out["idle"] = "0s: " + "; ".join(view.state["busy"])
    else:
        out["idle"] = "not sampled yet"
    return out


# ---- after the watcher acted --------------------------------------------------------------

def powered_off(cluster: ClusterRecord, queried: list[Node]) -> str | None:
    """"autostop" / "autodown" when every node is off while the state says ready and autostop was set."""
    setting = setting_of(cluster)
    if setting is None or cluster.status not in UP or not queried:
        return None
    states = {n.state for n in queried}
    if states <= {"terminated", "missing", "shutting-down"}:
        return "autodown"
    if states <= {"stopped"}:
        return "autodown" if setting.down else "autostop"
    return None


def reconcile_locked(cluster: ClusterRecord, provider: Provider, queried: list[Node]) -> list[str]:
    """``reconcile`` under the cluster's lock, taken only when there is something to mark."""
    if not powered_off(cluster, queried):
        return []
    with state.locked(cluster.name, purpose="autostop"):
        fresh = state.load(cluster.name)  # what another command may have done meanwhile
        lines = reconcile(fresh, provider, queried)
    cluster.status, cluster.nodes, cluster.provider_state = fresh.status, fresh.nodes, fresh.provider_state
    return lines


def refresh(clusters: list[ClusterRecord], report: Reporter = silent) -> list[str]:
    """For `ls`, `cost` and sweeps: notice the clusters (of this home) their watcher powered off.  A
    provider that cannot be reached now leaves its clusters as they were recorded."""
    lines = []
    for cluster in clusters:
        if cluster.status not in UP or not setting_of(cluster):
            continue
        try:
            provider = get_provider(cluster.provider, report=report)
            lines += reconcile_locked(cluster, provider, provider.query_instances(cluster))
        except ToolError as exc:
            lines.append(f"{cluster.name}: could not check autostop ({exc.message})")
    return lines


def reconcile(cluster: ClusterRecord, provider: Provider, queried: list[Node]) -> list[str]:
    """A cluster the watcher powered off: mark it, write the ledger, and after an autodown remove
    what is left (it costs nothing, but it is clutter and counts against quotas).  Caller holds
    the cluster's lock; returns what was done."""
    event = powered_off(cluster, queried)
    if event is None:
        return []
    done = provider.autostop_record(cluster) or {}
    when = float(done.get("t") or time.time())
    lines = [f"{cluster.name}: the cluster's watcher {'terminated' if event == 'autodown' else 'stopped'} it"
             + (f" ({done['why']})" if done.get("why") else "")]
    if event == "autodown":
        lines += provider.terminate_instances(cluster)
        cluster.status = ClusterState.AUTODOWNED
        for node in cluster.nodes:
            node.state = "terminated"
    else:
        cluster.status = ClusterState.AUTOSTOPPED
        for node in cluster.nodes:
            node.state = "stopped"
    cluster.provider_state["autostopped"] = {"t": when, "event": event, "why": done.get("why", "")}
    state.save(cluster)
    ledger.record(event, cluster, t=when)
    return lines


# ---- the verbs ----------------------------------------------------------------------------

def poweroff_command(provider: Provider) -> str:
    return provider.POWEROFF or DEFAULT_POWEROFF


def check_allowed(cluster: ClusterRecord, provider: Provider, setting: Setting | None) -> None:
    """Autostop powers machines off: only machines clustertool made, and (to stop) not one-time spot."""
    if not provider.owns_cluster(cluster) or cluster.provider_state.get("adopted"):
        raise UsageError(f"autostop is for machines clustertool made; {cluster.name!r} adopted existing ones",
                         hint="stop them yourself (clustertool never powers off machines it adopted)")
    if setting and not setting.down and cluster.options.get("spot"):
        raise UsageError("one-time spot instances cannot be stopped, only terminated",
                         hint="use --autodown (or --down) with --spot")


def apply(session: ClusterSession, provider: Provider, setting: Setting | None) -> str:
    """Give a ready cluster the setting (None: cancel): the provider's shutdown behaviour, then the
    leader's watcher.  Returns how the watcher runs."""
    cluster = session.record
    if setting is not None:
        provider.set_shutdown_behavior(cluster, "terminate" if setting.down else "stop")
    how = install(session, setting, poweroff_command(provider))
    cluster.autostop = setting.to_dict() if setting else None
    return how


@dataclass
class AutostopReport:
    """What `clustertool autostop` did or shows."""

    cluster: ClusterRecord
    setting: Setting | None
    changed: bool = False
    watcher: str = ""  # how the watcher runs (after a change)
    view: WatcherView | None = None

    def lines(self, now: float | None = None) -> dict:
        out = status_lines(self.cluster, self.view, now)
        if self.watcher:
            out["watcher"] = self.watcher
        return out

    def to_dict(self) -> dict:
        return {"cluster": self.cluster.name, "status": self.cluster.status,
                "autostop": self.setting.to_dict() if self.setting else None, "changed": self.changed,
                "watcher": self.watcher or None, "leader": self.view.to_dict() if self.view else None}


def check_request(idle: str | None, *, down: bool = False, wait_for: str | None = None,
                  cancel: bool = False) -> Setting | None:
    """The setting an `autostop` request asks for (None: cancel or show); bad combinations refused."""
    if idle is not None and cancel:
        raise UsageError("give an idle time or --cancel, not both")
    if idle is None and (down or wait_for):
        raise UsageError("--down and --wait-for go with an idle time", hint="e.g. clustertool autostop 30m --down")
    return Setting(parse_duration(idle), down, wait_for or "jobs") if idle is not None else None


def configure(session: ClusterSession, idle: str | None = None, *, down: bool = False, wait_for: str | None = None,
              cancel: bool = False) -> AutostopReport:
    """`clustertool autostop`: set (``idle``), cancel, or (neither) show the cluster's autostop."""
    setting = check_request(idle, down=down, wait_for=wait_for, cancel=cancel)
    if idle is None and not cancel:
        cluster = session.reload()
        view = read_watcher(session) if cluster.status == ClusterState.READY else None
        return AutostopReport(cluster, setting_of(cluster), view=view)
    with session.locked(purpose="autostop") as cluster:
        session.ready()
        check_allowed(cluster, session.provider, setting)
        how = apply(session, session.provider, setting)
        session.save()
    return AutostopReport(cluster, setting, changed=True, watcher=how, view=read_watcher(session))
