"""EC2 Capacity Blocks for ML: find offerings, buy one, list blocks, and `up --capacity-block`.

A Capacity Block is a capacity reservation (ReservationType ``capacity-block``) of N instances of
one type in one Availability Zone, paid upfront, from a set start to a set end.  Before its start
it is ``scheduled`` (or ``payment-pending``) and nothing launches into it; from the start it is
``active``; EC2 begins terminating the instances in it 30 minutes before its end (the "Capacity
Block Expiration Warning" event comes 40 minutes before the end), so that is the time the
cluster's leader warns jobs against (``RECLAIM_BEFORE_END_S``).

`up --capacity-block cr-…` checks the reservation before anything is made (a capacity block, the
type asked for, enough instances, not ended), launches in its zone only, with
``InstanceMarketOptions={"MarketType": "capacity-block"}`` and the reservation as target, and no
placement group of ours (the block's instances are already placed together by EC2).  Before the
block's start, `up` exits saying when it starts, or with ``--wait`` sleeps until then (in short
steps: Ctrl-C or SIGTERM ends the wait at once, and nothing was made yet).

The pure parts (dates, offering rows, the checks, the launch fields, the block-end record) are
unit-tested; the calls go through :class:`client.Aws` like every other EC2 call.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from clustertool.core.durations import format_duration, parse_duration
from clustertool.core.errors import ProviderError, ToolError, UsageError
from clustertool.core.model import BLOCK_END_SIGNALS, BLOCK_END_WARNING, ClusterRecord, Reporter, silent
from clustertool.providers.aws.client import Aws, aws_errors, poll_interval

RECLAIM_BEFORE_END_S = 30 * 60  # EC2 starts terminating a block's instances this long before its end
MAX_DAYS = 182
WAIT_REPORT_S = 600.0  # while `up --wait` sleeps: a line this often
STARTED_GRACE_S = 900.0  # after the start time: how long `up` waits for EC2 to call the block active
PLATFORM = "Linux/UNIX"
NOT_YET = ("scheduled", "payment-pending", "pending", "assessing", "delayed")  # states before a block is usable
GONE = ("expired", "cancelled", "failed", "payment-failed", "cancelling", "unavailable", "unsupported")


# ---- dates ----------------------------------------------------------------------------------

def parse_date(text: str, flag: str) -> dt.datetime:
    """``2026-12-01``, ``2026-12-01T08:00`` or with an offset / ``Z``; no offset means UTC."""
    value = str(text).strip()
    try:
        when = dt.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise UsageError(f"invalid {flag} {text!r}",
                         hint="write a date as 2026-12-01 or 2026-12-01T08:00 (UTC unless it has an offset)") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def epoch(value: Any) -> float | None:
    """A botocore timestamp (datetime) or ISO text as epoch seconds; None when absent."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return parse_date(value, "date").timestamp()
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def utc(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def left(t: float | None, now: float | None = None) -> str:
    """``in 3h12m`` / ``2m ago`` / ``in 1d2h`` (to the minute above an hour)."""
    if t is None:
        return "-"
    delta = t - (time.time() if now is None else now)
    span = abs(delta) if abs(delta) < 3600 else round(abs(delta) / 60) * 60
    days, rest = divmod(int(span), 86400)
    text = (f"{days}d" + (format_duration(rest) if rest else "")) if days else format_duration(span)
    return f"in {text}" if delta >= 0 else f"{text} ago"


# ---- reservations (blocks and ODCRs) --------------------------------------------------------

@dataclass
class Reservation:
    id: str
    type: str  # capacity-block | default (an On-Demand Capacity Reservation)
    state: str
    instance_type: str
    az: str
    total: int
    free: int
    start: float | None
    end: float | None
    platform: str = ""
    tenancy: str = ""

    @property
    def is_block(self) -> bool:
        return self.type == "capacity-block"

    @property
    def reclaim(self) -> float | None:
        """When EC2 starts taking the instances back: 30 minutes before a block's end; an ODCR's end."""
        if self.end is None:
            return None
        return self.end - RECLAIM_BEFORE_END_S if self.is_block else self.end

    def time_left(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        if self.state in NOT_YET and self.start and self.start > now:
            return f"starts {left(self.start, now)}"
        if self.end is None:
            return "no end date"
        return "ended" if self.end <= now else f"ends {left(self.end, now)}"

    def to_dict(self, now: float | None = None) -> dict:
        out = asdict(self)
        out.update(start=utc(self.start) if self.start else None, end=utc(self.end) if self.end else None,
                   start_epoch=self.start, end_epoch=self.end, time_left=self.time_left(now))
        return out


def reservation_from(doc: dict) -> Reservation:
    """One CapacityReservation document (DescribeCapacityReservations, PurchaseCapacityBlock)."""
    return Reservation(id=doc.get("CapacityReservationId", ""), type=doc.get("ReservationType") or "default",
                       state=doc.get("State", "unknown"), instance_type=doc.get("InstanceType", ""),
                       az=doc.get("AvailabilityZone", ""), total=int(doc.get("TotalInstanceCount") or 0),
                       free=int(doc.get("AvailableInstanceCount") or 0), start=epoch(doc.get("StartDate")),
                       end=epoch(doc.get("EndDate")), platform=doc.get("InstancePlatform", ""),
                       tenancy=doc.get("Tenancy", ""))


def reservations(aws: Aws, ids: list[str] | None = None) -> list[Reservation]:
    """The account's capacity reservations (blocks and ODCRs), or the ones named."""
    kwargs: dict[str, Any] = {"CapacityReservationIds": ids} if ids else {}
    with aws_errors("describing capacity reservations"):
        docs = aws.paginate("describe_capacity_reservations", "CapacityReservations", **kwargs)
    return sorted((reservation_from(d) for d in docs), key=lambda r: (r.start or 0, r.id))


def one(aws: Aws, reservation_id: str) -> Reservation:
    try:
        found = reservations(aws, [reservation_id])
    except ToolError as exc:
        if "NotFound" in exc.message or "Malformed" in exc.message:
            raise UsageError(f"--capacity-block {reservation_id}: no such capacity reservation in {aws.region}",
                             hint="`clustertool capacity ls` lists the account's blocks") from None
        raise
    if not found:
        raise UsageError(f"--capacity-block {reservation_id}: no such capacity reservation in {aws.region}",
                         hint="`clustertool capacity ls` lists the account's blocks")
    return found[0]


# ---- up --capacity-block ------------------------------------------------------------------

def check_id(value: str) -> str:
    if not value.startswith("cr-") or len(value) < 4:
        raise UsageError(f"--capacity-block {value!r}: expected a capacity reservation id (cr-…)",
                         hint="`clustertool capacity ls` lists them; `clustertool capacity buy` makes one")
    return value


def validate(options: dict) -> None:
    """Offline checks of the block options of `up` (each failure one line naming the flag)."""
    block = options.get("capacity_block")
    for key in ("wait", "block_end_warning", "block_end_signal"):
        if options.get(key) not in (None, False) and not block:
            raise UsageError(f"--{key.replace('_', '-')}: only means something with --capacity-block",
                             hint="add --capacity-block cr-…, or drop the flag")
    if not block:
        return
    check_id(block)
    for key, why in (("spot", "a block is its own market: it is paid upfront, not spot"),
                     ("retry_until_up", "a block has its capacity; use --wait to wait for its start"),
                     ("adopt_tag", "adopting launches nothing"), ("adopt_ids", "adopting launches nothing"),
                     ("capacity_reservation", "a launch targets one reservation"),
                     ("capacity_reservation_group", "a launch targets one reservation")):
        if options.get(key):
            raise UsageError(f"--capacity-block does not go with --{key.replace('_', '-')}: {why}")
    if options.get("reservations") not in (None, "open"):
        raise UsageError("--capacity-block does not go with --reservations: the launch targets the block")
    warning_s(options)
    signal_of(options)


def warning_s(options: dict) -> int:
    return parse_duration(str(options.get("block_end_warning") or BLOCK_END_WARNING), "--block-end-warning")


def signal_of(options: dict) -> str:
    sig = str(options.get("block_end_signal") or "TERM").upper().removeprefix("SIG")
    if sig not in BLOCK_END_SIGNALS:
        raise UsageError(f"--block-end-signal {options.get('block_end_signal')!r}: "
                         f"use one of {', '.join(BLOCK_END_SIGNALS)}")
    return sig


def problems(block: Reservation, instance_type: str | None, count: int, now: float | None = None) -> list[str]:
    """Why ``block`` cannot hold this cluster (empty: it can, now or at its start)."""
    now = time.time() if now is None else now
    out = []
    if not block.is_block:
        out.append(f"it is an On-Demand Capacity Reservation, not a Capacity Block (use --capacity-reservation "
                   f"{block.id})")
    if instance_type and block.instance_type and block.instance_type != instance_type:
        out.append(f"it holds {block.instance_type}, not {instance_type}")
    if block.state in GONE or (block.end is not None and block.end <= now):
        out.append(f"it is {block.state if block.state in GONE else 'over'} (ended {utc(block.end)})")
    elif block.reclaim is not None and block.reclaim <= now:
        out.append(f"EC2 is already taking its instances back (from {utc(block.reclaim)}, 30 minutes before its "
                   f"end {utc(block.end)})")
    usable = block.free if block.state == "active" else block.total
    if usable < count:
        what = "free" if block.state == "active" else "in it"
        out.append(f"it has {usable} instance(s) {what}, fewer than --nodes {count}")
    return out


def check(block: Reservation, instance_type: str | None, count: int, now: float | None = None) -> None:
    found = problems(block, instance_type, count, now)
    if found:
        raise UsageError(f"--capacity-block {block.id} cannot take this cluster: {'; '.join(found)}",
                         hint="`clustertool capacity ls` shows the account's blocks with type, count and dates")


def prepare(aws: Aws, options: dict, count: int) -> Reservation:
    """`up --capacity-block`'s first look: the reservation, checked against the request (one line
    when it cannot hold the cluster).  Without --instance-type the block's type is the cluster's."""
    block = one(aws, check_id(options["capacity_block"]))
    if not options.get("instance_type") and block.instance_type:
        options["instance_type"] = block.instance_type
    check(block, options.get("instance_type"), count)
    return block


def zone(block: Reservation, az: str | None) -> str:
    """The block's zone, which --az / --subnet may only repeat."""
    if az and az != block.az:
        raise UsageError(f"--capacity-block {block.id} is in {block.az}, not {az}",
                         hint="drop --az (a block launches in its own zone), or give a --subnet in that zone")
    return block.az


def started(aws: Aws, block: Reservation, options: dict, count: int, report: Reporter = silent) -> Reservation:
    """The block once it is active (see :func:`wait_for_start`), checked again (its free count now)."""
    if not_started(block):
        block = wait_for_start(aws, block, bool(options.get("wait")), report)
        check(block, options.get("instance_type"), count)
    return block


def prepaid_line(block: Reservation) -> str:
    return (f"$0.00/h more: the {block.total} x {block.instance_type} of capacity block {block.id} were paid "
            "upfront (reduction servers, if any, are billed on demand)")


def not_started(block: Reservation, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    return block.state != "active" and (block.state in NOT_YET or (block.start or 0) > now)


def starts_line(block: Reservation, now: float | None = None) -> str:
    return (f"capacity block {block.id} ({block.total} x {block.instance_type} in {block.az}) starts at "
            f"{utc(block.start)} ({left(block.start, now)}); state {block.state}")


class BlockNotStarted(ToolError):
    """`up --capacity-block` before the block's start, without --wait: nothing was made."""

    exit_code = 75  # EX_TEMPFAIL: try again later (at the start time the message names)


def wait_for_start(aws: Aws, block: Reservation, wait: bool, report: Reporter = silent,
                   sleep: Callable[[float], None] = time.sleep) -> Reservation:
    """Return the block once EC2 calls it active.  Without ``wait``, a block that has not started
    raises :class:`BlockNotStarted` naming its start.  With it: sleep to the start in steps of at most
    15 s (a signal's handler raises inside one at once), a line every ``WAIT_REPORT_S``; then poll
    until the state is ``active`` (up to ``STARTED_GRACE_S`` after the start)."""
    if not not_started(block):
        return block
    if not wait:
        raise BlockNotStarted(f"{starts_line(block)}: nothing was made",
                              hint=f"run `up` again after {utc(block.start)}, or add --wait to wait for it here")
    report(f"{starts_line(block)}; waiting for it (Ctrl-C or SIGTERM stops the wait; nothing is made before)")
    said = time.monotonic()
    deadline = (block.start or time.time()) + STARTED_GRACE_S
    while not_started(block):
        now = time.time()
        if now > deadline:
            late = format_duration(now - (block.start or now))
            raise ProviderError(f"capacity block {block.id} is still {block.state}, {late} after its start time "
                                f"{utc(block.start)}",
                                hint="check it with `clustertool capacity ls`; nothing was made")
        pause = (block.start or now) - now if (block.start or 0) > now else poll_interval()
        sleep(max(0.01, min(pause, 15.0)))
        if time.monotonic() - said >= WAIT_REPORT_S:
            report(f"still waiting: {starts_line(block)}")
            said = time.monotonic()
        if (block.start or 0) <= time.time():
            block = one(aws, block.id)
    report(f"capacity block {block.id} is active ({block.free} of {block.total} free); launching")
    return block


# ---- what the launch and the state get ------------------------------------------------------

def launch_fields(options: dict) -> dict[str, Any]:
    """RunInstances' extra fields for a launch into ``--capacity-block`` (empty without it)."""
    block = options.get("capacity_block")
    if not block:
        return {}
    return {"InstanceMarketOptions": {"MarketType": "capacity-block"},
            "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": block}}}


def uses_block(options: dict) -> bool:
    return bool(options.get("capacity_block"))


def state_record(block: Reservation) -> dict:
    """``provider_state["capacity_block"]``: what `status` shows of the block."""
    return {"id": block.id, "az": block.az, "instance_type": block.instance_type, "total": block.total,
            "start": block.start, "end": block.end, "reclaim": block.reclaim}


def block_end_record(block: Reservation, options: dict) -> dict:
    """``ClusterRecord.block_end``: what the leader's watcher acts on (see cluster/blockend.py)."""
    return {"at": block.reclaim, "end": block.end, "warning_s": warning_s(options), "signal": signal_of(options),
            "source": f"capacity block {block.id}"}


def plan_lines(block: Reservation, options: dict) -> list[str]:
    return [
        f"capacity block {block.id}: {block.total} x {block.instance_type} in {block.az}, {block.state}, "
        f"{utc(block.start)} to {utc(block.end)}; launched with InstanceMarketOptions MarketType=capacity-block "
        "into it (no placement group of ours: EC2 places a block's instances together)",
        *([f"it starts {left(block.start)}: " + ("`up` waits for it (--wait)" if options.get("wait")
                                                  else "`up` will exit saying so; add --wait to wait")]
          if not_started(block) else []),
        f"at its end: EC2 takes the instances back from {utc(block.reclaim)}; the leader sends jobs "
        f"SIG{signal_of(options)} {format_duration(warning_s(options))} before that",
    ]


def record(cluster: ClusterRecord, block: Reservation) -> None:
    """What the cluster's state keeps of the block: for status, the ledger (prepaid) and the watcher."""
    cluster.provider_state["capacity_block"] = state_record(block)
    cluster.provider_state["prepaid"] = f"capacity block {block.id}"  # the ledger counts no hourly price
    cluster.block_end = block_end_record(block, cluster.options)


def status_lines(cluster: ClusterRecord, now: float | None = None) -> dict[str, str]:
    """`status` lines of a cluster launched into a block (empty otherwise)."""
    rec = cluster.provider_state.get("capacity_block")
    if not rec:
        return {}
    return {"hourly price": f"$0.00/h more: paid upfront with capacity block {rec['id']} "
                            "(reduction servers, if any, are billed on demand)",
            "cost so far": "the block's upfront fee (see `clustertool cost`)",
            "capacity block": f"{rec['id']}: {rec['total']} x {rec['instance_type']} in {rec['az']}, "
                              f"{utc(rec.get('start'))} to {utc(rec.get('end'))}; EC2 takes the instances back "
                              f"from {utc(rec.get('reclaim'))} ({left(rec.get('reclaim'), now)})"}
