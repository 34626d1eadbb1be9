"""The end of a cluster's machines, seen from this machine: the leader warns running jobs first.

A cluster launched into an EC2 Capacity Block (`up --capacity-block`) ends at a set time: EC2
starts terminating its instances 30 minutes before the block's end.  ``ClusterRecord.block_end``
holds ``{"at": epoch when the machines go, "end": the block's end, "warning_s", "signal",
"source"}``; the autostop watcher on the leader (nodeprogs/autostop.py, installed with the
record in its config whether or not autostop is set) sends every rank of each running job
``signal`` from ``at - warning_s`` on, once per job, so a checkpoint gets written, and logs it.

``clustertool capacity block-end -c NAME --at TIME`` sets (or changes, or with ``--off`` removes)
the same record on any cluster: the warning or signal of a block cluster, or an end for machines
whose end clustertool cannot know (adopted instances in a block, a static cluster's booking, a
local cluster: that is how the local tests exercise the real watcher, with an end a minute away).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from clustertool.cluster import autostop
from clustertool.cluster.session import ClusterSession
from clustertool.core.durations import format_duration, parse_duration
from clustertool.core.errors import UsageError
from clustertool.core.model import BLOCK_END_SIGNALS, BLOCK_END_WARNING, ClusterRecord, JobRecord


def utc(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def parse_at(text: str, now: float | None = None) -> float:
    """``+90s`` / ``+2h`` (from now), or a date and time (``2026-12-01T08:00``, UTC unless an offset)."""
    now = time.time() if now is None else now
    value = str(text).strip()
    if value.startswith("+"):
        return now + parse_duration(value[1:], "--at")
    try:
        when = dt.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise UsageError(f"invalid --at {text!r}", hint="write +2h (from now) or 2026-12-01T08:00 (UTC)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def signal_name(value: str | None) -> str:
    sig = str(value or "TERM").upper().removeprefix("SIG")
    if sig not in BLOCK_END_SIGNALS:
        raise UsageError(f"--block-end-signal {value!r}: use one of {', '.join(BLOCK_END_SIGNALS)}")
    return sig


def warn_at(block: dict) -> float:
    return float(block["at"]) - float(block.get("warning_s") or 0)


def describe(block: dict, now: float | None = None) -> str:
    """``capacity block cr-…: the machines go at T (in 5h); jobs get SIGTERM at T-30m``."""
    now = time.time() if now is None else now
    at, warn = float(block["at"]), warn_at(block)
    when = "passed" if warn <= now else f"in {format_duration(warn - now)}"
    return (f"{block.get('source') or 'set by `clustertool capacity block-end`'}: the machines go at {utc(at)}"
            f"{'' if at > now else ' (passed)'}; running jobs get SIG{block.get('signal') or 'TERM'} "
            f"{format_duration(float(block.get('warning_s') or 0))} before, at {utc(warn)} ({when})")


def job_note(signalled: dict) -> str:
    """What `jobs` says of a job the leader warned (its folder's ``blockend``)."""
    ranks = signalled.get("ranks") or {}
    count = sum(len(p) for p in ranks.values())
    return (f"signalled {signalled.get('signal', 'TERM')} at {utc(signalled.get('t'))} ({count} rank(s)): "
            f"{signalled.get('source') or 'the machines'} end, taken back at {utc(signalled.get('at'))}")


def status_extra(session: ClusterSession, check_ssh: bool, now: float | None = None) -> dict:
    """`status` lines: when the machines go and when jobs are warned; the jobs warned so far (read
    from the leader's watcher when SSH is checked)."""
    cluster = session.record
    if not cluster.block_end or not cluster.block_end.get("at"):
        return {}
    out = {"block end": describe(cluster.block_end, now)}
    if check_ssh and cluster.status == "ready":
        view = autostop.read_watcher(session)
        jobs = (view.blockend.get("jobs") or {}) if view else {}
        if view is None:
            out["block end warned"] = "unknown (the leader did not answer)"
        elif jobs:
            out["block end warned"] = "; ".join(f"job {j}: {job_note(r)}" for j, r in sorted(jobs.items()))
    return out


def jobs_lines(jobs: list[JobRecord]) -> list[str]:
    return [f"job {j.id}: {job_note(j.block_end_signal)}" for j in jobs if j.block_end_signal]


@dataclass
class BlockEndReport:
    cluster: ClusterRecord
    changed: bool
    watcher: str = ""

    def to_dict(self) -> dict:
        block = self.cluster.block_end
        return {"cluster": self.cluster.name, "block_end": block, "changed": self.changed,
                "warn_at": warn_at(block) if block else None, "watcher": self.watcher or None,
                "text": describe(block) if block else None}


def request(cluster: ClusterRecord, at: str | None, warning: str | None, signal: str | None,
            off: bool, now: float | None = None) -> dict | None:
    """The record `capacity block-end` asks for (None: off); bad input is one line."""
    if off:
        if at or warning or signal:
            raise UsageError("--off removes the block end: give it alone")
        return None
    old = cluster.block_end or {}
    if at is None and not old:
        raise UsageError(f"cluster {cluster.name!r} has no block end yet: give --at TIME",
                         hint="e.g. --at +2h or --at 2026-12-01T08:00 (UTC)")
    new = dict(old)
    if at is not None:
        new.update(at=parse_at(at, now), source=f"an end set by `clustertool capacity block-end` ({at})")
    new["warning_s"] = parse_duration(warning, "--block-end-warning") if warning else int(
        old.get("warning_s") or parse_duration(BLOCK_END_WARNING))
    new["signal"] = signal_name(signal or old.get("signal"))
    return new


def configure(session: ClusterSession, at: str | None = None, warning: str | None = None,
              signal: str | None = None, off: bool = False) -> BlockEndReport:
    """`clustertool capacity block-end`: set, change or (``off``) remove the block end the leader
    watches, and give the leader's watcher the new config at once.  With nothing to change: show."""
    if at is None and warning is None and signal is None and not off:
        return BlockEndReport(session.reload(), changed=False)
    with session.locked(purpose="block-end") as cluster:
        session.ready()
        cluster.block_end = request(cluster, at, warning, signal, off)
        how = autostop.install(session, autostop.setting_of(cluster), autostop.poweroff_command(session.provider))
        session.save()
    return BlockEndReport(cluster, changed=True, watcher=how)
