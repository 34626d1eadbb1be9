"""On-Demand Capacity Reservations (ODCR) for `up`.

- ``--capacity-reservation cr-…``: launch into that reservation (CapacityReservationTarget). Before
  anything is made it is described and checked: active, the instance type asked for, Linux/UNIX,
  default tenancy, not past its end date, an ODCR (a Capacity Block goes with --capacity-block),
  at least --nodes instances free.  The launch happens in the reservation's zone only, without a
  placement group of ours (a reservation in a cluster placement group: that group).
- ``--capacity-reservation-group ARN``: launch into the reservations of a resource group (EC2 picks
  one with capacity; the group cannot be checked beforehand with EC2 calls alone).
- ``--reservations open|only|none``: the preference when no reservation is named: ``open`` (EC2's
  default: matching open reservations are used first), ``only`` (``capacity-reservations-only``:
  launch only into open reservations, fail otherwise), ``none`` (never use a reservation).

A reservation is billed whether instances run in it or not, so instances launched into a named
reservation cost nothing more: the cluster's price and the cost ledger count them at $0/h
(``provider_state["prepaid"]`` says by what), not twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from clustertool.core.errors import ToolError, UsageError
from clustertool.providers.aws import capacity_blocks
from clustertool.providers.aws.client import Aws, aws_errors

PREFERENCES = {"open": "open", "only": "capacity-reservations-only", "none": "none"}
PLATFORM = "Linux/UNIX"  # what clustertool's images (the Deep Learning AMIs) are billed as
KEY = "capacity_reservation"  # provider_state: the reservation launched into


@dataclass
class Target:
    """The reservation `up --capacity-reservation` launches into, as checked."""

    res: capacity_blocks.Reservation
    placement_group: str | None = None  # the cluster placement group the reservation is in

    def record(self) -> dict[str, Any]:
        """``provider_state["capacity_reservation"]``: what `status` shows."""
        r = self.res
        return {"id": r.id, "az": r.az, "instance_type": r.instance_type, "total": r.total,
                "free_at_launch": r.free, "end": r.end, "placement_group": self.placement_group}


def named(options: dict) -> bool:
    """Whether the launch goes into a named reservation or group (no zone fan-out, no group of ours)."""
    return bool(options.get("capacity_reservation") or options.get("capacity_reservation_group"))


def validate(options: dict) -> None:
    """Offline checks of the reservation options (each failure one line naming the flag)."""
    rid, group = options.get("capacity_reservation"), options.get("capacity_reservation_group")
    pref = options.get("reservations")
    if pref is not None and pref not in PREFERENCES:
        raise UsageError(f"--reservations {pref!r}: use one of {', '.join(PREFERENCES)}")
    if rid and group:
        raise UsageError("--capacity-reservation and --capacity-reservation-group: give one of them, not both")
    if (rid or group) and pref not in (None, "open"):
        raise UsageError(f"--reservations {pref} does not go with a named reservation",
                         hint="a named reservation is used by itself; drop --reservations")
    if rid and not (str(rid).startswith("cr-") and len(str(rid)) > 3):
        raise UsageError(f"--capacity-reservation {rid!r}: expected a capacity reservation id (cr-…)",
                         hint="`aws ec2 describe-capacity-reservations` lists them")
    if group and not (str(group).startswith("arn:") and ":resource-groups:" in str(group)):
        raise UsageError(f"--capacity-reservation-group {group!r}: expected a resource group ARN "
                         "(arn:aws:resource-groups:REGION:ACCOUNT:group/NAME)")
    uses = rid or group or pref in ("only",)
    if uses and options.get("capacity_block"):
        raise UsageError("--capacity-block is a reservation of its own: it does not go with "
                         "--capacity-reservation, --capacity-reservation-group or --reservations only")
    if uses and options.get("spot"):
        raise UsageError("capacity reservations hold on-demand instances: they do not go with --spot")


def problems(r: capacity_blocks.Reservation, instance_type: str, count: int, now: float | None = None) -> list[str]:
    """Why reservation ``r`` cannot take ``count`` x ``instance_type`` now (empty: it can)."""
    now = time.time() if now is None else now
    out = []
    if r.is_block:
        out.append(f"it is a Capacity Block (use --capacity-block {r.id})")
    if r.state != "active":
        out.append(f"it is {r.state}, not active")
    if r.instance_type != instance_type:
        out.append(f"it holds {r.instance_type}, not {instance_type}")
    if r.platform and r.platform != PLATFORM:
        out.append(f"it is for {r.platform} instances, not {PLATFORM}")
    if r.tenancy and r.tenancy != "default":
        out.append(f"its tenancy is {r.tenancy} (clustertool launches default tenancy)")
    if r.end is not None and r.end <= now:
        out.append(f"it ended {capacity_blocks.utc(r.end)}")
    if r.free < count:
        out.append(f"it has {r.free} of {r.total} instance(s) free, fewer than --nodes {count}")
    return out


def describe_one(aws: Aws, rid: str) -> dict[str, Any]:
    """The CapacityReservation document of ``rid``; a UsageError when the region has none such."""
    try:
        with aws_errors(f"describing capacity reservation {rid}"):
            docs = aws.call("describe_capacity_reservations", CapacityReservationIds=[rid]).get(
                "CapacityReservations", [])
    except ToolError as exc:
        if "InvalidCapacityReservationId" not in exc.message:
            raise
        docs = []
    if not docs:
        raise UsageError(f"--capacity-reservation {rid}: no such capacity reservation in {aws.region}",
                         hint="`aws ec2 describe-capacity-reservations` lists the account's reservations")
    return docs[0]


def prepare(aws: Aws, options: dict, count: int, instance_type: str) -> Target | None:
    """Describe and check ``--capacity-reservation`` before anything is made (None without one)."""
    rid = options.get("capacity_reservation")
    if not rid:
        return None
    doc = describe_one(aws, rid)
    res = capacity_blocks.reservation_from(doc)
    found = problems(res, instance_type, count)
    if found:
        raise UsageError(f"--capacity-reservation {rid} cannot take {count} x {instance_type}: {'; '.join(found)}",
                         hint="nothing was made; `aws ec2 describe-capacity-reservations` shows its type, zone, "
                              "state and free count")
    arn = doc.get("PlacementGroupArn") or ""
    return Target(res, arn.rsplit("/", 1)[-1] if "placement-group/" in arn else None)


def zone(target: Target, az: str | None) -> str:
    """The reservation's zone; --az/--subnet naming another one is refused."""
    if az and az != target.res.az:
        raise UsageError(f"--capacity-reservation {target.res.id} is in {target.res.az}, not {az}",
                         hint="drop --az (and --subnet), or pick a subnet of the reservation's zone")
    return target.res.az


def launch_fields(options: dict) -> dict[str, Any]:
    """RunInstances' CapacityReservationSpecification (empty: EC2's default, open)."""
    if options.get("capacity_reservation"):
        target: dict[str, str] = {"CapacityReservationId": options["capacity_reservation"]}
    elif options.get("capacity_reservation_group"):
        target = {"CapacityReservationResourceGroupArn": options["capacity_reservation_group"]}
    else:
        pref = options.get("reservations") or "open"
        return {} if pref == "open" else {
            "CapacityReservationSpecification": {"CapacityReservationPreference": PREFERENCES[pref]}}
    return {"CapacityReservationSpecification": {"CapacityReservationTarget": target}}


def prepaid(options: dict) -> str | None:
    """What already pays for the instances (None: they are billed by the hour as usual)."""
    if options.get("capacity_reservation"):
        return f"capacity reservation {options['capacity_reservation']}"
    if options.get("reservations") == "only":
        return "an open capacity reservation (--reservations only)"
    return None


def plan_lines(target: Target | None, options: dict) -> list[str]:
    if target is not None:
        r = target.res
        ends = f"ends {capacity_blocks.utc(r.end)} ({capacity_blocks.left(r.end)})" if r.end else "no end date"
        where = f"its placement group {target.placement_group}" if target.placement_group else \
            "no placement group of ours"
        return [f"capacity reservation {r.id}: {r.free} of {r.total} x {r.instance_type} free in {r.az}, {r.state}, "
                f"{ends}; launched into it (CapacityReservationTarget), in {r.az} only, {where}",
                "already paid for: the reservation is billed whether used or not, so its instances add $0/h"]
    if options.get("capacity_reservation_group"):
        return [f"capacity reservation group {options['capacity_reservation_group']}: EC2 launches into its "
                "reservations (checked by EC2 at launch)"]
    pref = options.get("reservations") or "open"
    words = {"open": "open (EC2's default: matching open reservations are used first)",
             "only": "capacity-reservations-only (launch only into open reservations; fails otherwise)",
             "none": "none (never into a reservation)"}
    return [f"capacity reservations: {words[pref]}"]


def hourly_text(ps: dict, hourly: str) -> str:
    """The price line of a cluster whose instances a reservation already pays for."""
    if not ps.get("prepaid"):
        return hourly
    return f"$0.00/h more: {ps['prepaid']} pays for them, billed whether used or not (at list price: {hourly})"


def stop_line(ps: dict, count: int) -> str | None:
    """What `down` says of the bill when a reservation pays for the instances (None: no reservation)."""
    if not ps.get("prepaid"):
        return None
    return f"giving {count} instance(s) back to {ps['prepaid']} (it bills until it ends or is cancelled)"


def record(ps: dict, target: Target | None, options: dict) -> None:
    """What `up` keeps of the reservation: the reservation itself (status) and what pays (pricing, ledger)."""
    if target is not None:
        ps[KEY] = target.record()
    if prepaid(options):
        ps["prepaid"] = prepaid(options)


def status_lines(ps: dict, shown: dict[str, str], now: float | None = None) -> dict[str, str]:
    """Status lines of a cluster in a reservation: the reservation, and its price and cost so far as
    $0 more (``shown``: the lines as they would be without the reservation)."""
    out: dict[str, str] = {}
    if ps.get("prepaid"):
        out["hourly price"] = hourly_text(ps, shown.get("hourly price", "unknown"))
        out["cost so far"] = f"$0.00 more (paid with {ps['prepaid']})"
    rec = ps.get(KEY)
    if rec:
        end = rec.get("end")
        ends = f"ends {capacity_blocks.utc(end)} ({capacity_blocks.left(end, now)})" if end else "no end date"
        out["capacity reservation"] = (f"{rec['id']} ({rec['total']} x {rec['instance_type']} in {rec['az']}; "
                                       f"{rec['free_at_launch']} were free at launch; {ends})")
    return out


def placement_group(ps: dict) -> str | None:
    """The placement group of the reservation launched into (None: none, or no reservation)."""
    return (ps.get(KEY) or {}).get("placement_group")
