"""A stand-in for the EC2 calls the moto server lacks, sitting in front of it like
``tests/aws/faultproxy.py`` does: the tests point botocore (``AWS_ENDPOINT_URL``) at this loopback
HTTP server.  It is test-only and it is a stand-in, not AWS: it answers

- DescribeCapacityReservations, CreateCapacityReservation (On-Demand Capacity Reservations),
- DescribeCapacityBlockOfferings, PurchaseCapacityBlock (EC2 Capacity Blocks for ML),
- DescribeInstanceTopology (the network nodes above each instance),

from its own state, which the tests seed (``add_reservation``, ``add_offering``, ``set_topology``).
Requests are read and checked, and answers written, by botocore's own EC2 service model
(``tests/aws/ec2shapes.py``): an unknown or missing-required parameter is a 400 error document as
EC2 sends it, and an answer that does not fit the output shape is never sent.

Every other request is forwarded to the moto server unchanged.  RunInstances is forwarded too
(moto ignores CapacityReservationSpecification and Capacity Block market options), after its
parameters are recorded in ``runs`` and its reservation target checked the way EC2 does: the
reservation exists, is active, matches type, zone and platform and has that many free
(``ReservationCapacityExceeded`` otherwise), a Capacity Block is launched into with
``MarketType=capacity-block`` only; a launch with preference ``open`` (the default) or
``capacity-reservations-only`` takes room in a matching reservation whose match criteria are open
(the latter fails without one); resource-group targets are recorded, not modelled.  Launches take
free capacity from the reservation;
TerminateInstances gives it back.  The error codes for a reservation that is not active or
does not fit (``IncorrectState``, ``InvalidParameterCombination``) are this stand-in's choice.

Reservation states follow ``clock()`` (settable): a Capacity Block is ``scheduled`` before its
start, ``active`` until its end, ``expired`` after; any reservation past its end date is expired.
"""

from __future__ import annotations

import datetime as dt
import http.client
import itertools
import secrets
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from tests.aws.ec2shapes import (
    RequestError,
    ShapeError,
    decode_request,
    encode_response,
    error_document,
    parse_response,
)
from tests.aws.faultproxy import HOP

ACCOUNT = "123456789012"  # moto's default account
ANSWERED = ("DescribeCapacityReservations", "CreateCapacityReservation", "DescribeCapacityBlockOfferings",
            "PurchaseCapacityBlock", "DescribeInstanceTopology")
UTC = dt.timezone.utc
# DescribeCapacityReservations filters the stand-in knows -> the reservation's member
RESERVATION_FILTERS = {"instance-type": "InstanceType", "availability-zone": "AvailabilityZone", "state": "State",
                       "tenancy": "Tenancy", "instance-platform": "InstancePlatform", "owner-id": "OwnerId",
                       "reservation-type": "ReservationType", "instance-match-criteria": "InstanceMatchCriteria",
                       "end-date-type": "EndDateType"}
TOPOLOGY_FILTERS = {"instance-type": "InstanceType", "availability-zone": "AvailabilityZone", "zone-id": "ZoneId"}


def now() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0)


class Ec2Front:
    """The stand-in server; ``url`` is where botocore is pointed, ``target`` the moto server."""

    def __init__(self, target: str, region: str = "us-east-1"):
        self.target = urllib.parse.urlsplit(target)
        self.region = region
        self.clock: Callable[[], dt.datetime] = now
        self.reservations: dict[str, dict[str, Any]] = {}
        self.offerings: dict[str, dict[str, Any]] = {}
        self.topology: dict[str, dict[str, Any]] = {}
        self.runs: list[dict[str, Any]] = []  # every RunInstances request's parameters, in order
        self.calls: list[str] = []  # every action seen, in order
        self.failures: dict[str, str] = {}  # action -> error code to answer it with
        self._held: dict[str, str] = {}  # instance id -> the reservation it launched into
        self._next_paths: list[list[str]] = []  # topology_by_launch: paths for the next instances launched
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                front._handle(self)

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- seeding (the tests' side) ------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):04x}{secrets.token_hex(6)}"

    def add_reservation(self, instance_type: str, az: str, count: int, *, rid: str | None = None,
                        state: str = "active", available: int | None = None, start: dt.datetime | None = None,
                        end: dt.datetime | None = None, tenancy: str = "default", platform: str = "Linux/UNIX",
                        reservation_type: str = "default", match: str = "targeted",
                        tags: dict[str, str] | None = None) -> dict[str, Any]:
        """A Capacity Reservation (``reservation_type`` 'default': an ODCR; 'capacity-block': a block
        from ``start`` to ``end``).  Returns its CapacityReservation document."""
        rid = rid or self._id("cr")
        doc: dict[str, Any] = {
            "CapacityReservationId": rid, "OwnerId": ACCOUNT,
            "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{ACCOUNT}:capacity-reservation/{rid}",
            "InstanceType": instance_type, "InstancePlatform": platform, "AvailabilityZone": az,
            "Tenancy": tenancy, "TotalInstanceCount": count,
            "AvailableInstanceCount": count if available is None else available,
            "EbsOptimized": True, "EphemeralStorage": False, "State": state,
            "StartDate": start or self.clock(), "EndDateType": "limited" if end else "unlimited",
            "InstanceMatchCriteria": "targeted" if reservation_type == "capacity-block" else match,
            "CreateDate": self.clock(), "ReservationType": reservation_type,
            "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
        }
        if end:
            doc["EndDate"] = end
        with self._lock:
            self.reservations[rid] = doc
        return self.reservation(rid)

    def add_offering(self, instance_type: str, az: str, count: int, start: dt.datetime, hours: int,
                     fee: str = "7840.32", currency: str = "USD", oid: str | None = None) -> dict[str, Any]:
        """A Capacity Block offering of ``count`` instances for ``hours`` from ``start``."""
        oid = oid or self._id("cb")
        doc = {"CapacityBlockOfferingId": oid, "InstanceType": instance_type, "AvailabilityZone": az,
               "InstanceCount": count, "StartDate": start, "EndDate": start + dt.timedelta(hours=hours),
               "CapacityBlockDurationHours": hours, "UpfrontFee": fee, "CurrencyCode": currency,
               "Tenancy": "default"}
        with self._lock:
            self.offerings[oid] = doc
        return dict(doc)

    def set_topology(self, instance_id: str, network_nodes: list[str], instance_type: str = "p5.48xlarge",
                     az: str = "us-east-1a", group_name: str | None = None) -> None:
        """The network nodes above ``instance_id``, outermost first (EC2 gives three layers)."""
        doc = {"InstanceId": instance_id, "InstanceType": instance_type, "NetworkNodes": list(network_nodes),
               "AvailabilityZone": az}
        if group_name:
            doc["GroupName"] = group_name
        with self._lock:
            self.topology[instance_id] = doc

    def topology_by_launch(self, paths: list[list[str]]) -> None:
        """The next instances RunInstances launches (in the order of its answer) get these network-node
        paths, one each: a recorded DescribeInstanceTopology answer replayed onto the test's instances."""
        with self._lock:
            self._next_paths = [list(p) for p in paths]

    def fail(self, action: str, code: str) -> None:
        """Answer every ``action`` with the EC2 error ``code`` (e.g. UnauthorizedOperation)."""
        self.failures[action] = code

    def reservation(self, rid: str) -> dict[str, Any]:
        """The reservation as DescribeCapacityReservations shows it now."""
        with self._lock:
            doc = dict(self.reservations[rid])
        doc["State"] = self._state(doc)
        return doc

    def _state(self, doc: dict[str, Any]) -> str:
        at, end = self.clock(), doc.get("EndDate")
        if doc["State"] in ("cancelled", "failed", "payment-failed", "payment-pending"):
            return doc["State"]
        if end is not None and at >= end:
            return "expired"
        if doc["ReservationType"] == "capacity-block":
            return "scheduled" if at < doc["StartDate"] else "active"
        return doc["State"]

    # ---- one request --------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        fields = {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode(errors="replace"),
                                                              keep_blank_values=True).items()}
        action = fields.get("Action", "") if not handler.headers.get("X-Amz-Target") else ""
        with self._lock:
            self.calls.append(action or "?")
        try:
            if action in self.failures:
                raise RequestError(self.failures[action], f"the stand-in was told to refuse {action}")
            if action in ANSWERED:
                params = decode_request(action, fields)
                result = getattr(self, "_" + action)(params)
                answer = (200, [("Content-Type", "text/xml")], encode_response(action, result))
            elif action == "RunInstances":
                answer = self._run_instances(handler, body, decode_request(action, fields))
            else:
                answer = self._forward(handler, body)
                if action == "TerminateInstances" and answer[0] == 200:
                    self._release(decode_request(action, fields).get("InstanceIds", []))
        except RequestError as exc:
            answer = (400, [("Content-Type", "text/xml")], error_document(exc.code, exc.message))
        except ShapeError as exc:  # the stand-in's own document does not fit the model: fail loudly
            answer = (500, [("Content-Type", "text/xml")], error_document("InternalError", f"stand-in: {exc}"))
        status, headers, payload = answer
        try:
            handler.send_response(status)
            for key, value in headers:
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client is gone

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes):
        conn = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP}
            conn.request(handler.command, handler.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            return response.status, [(k, v) for k, v in response.getheaders() if k.lower() not in HOP], payload
        finally:
            conn.close()

    # ---- RunInstances / TerminateInstances -----------------------------------------------------

    def _run_instances(self, handler: BaseHTTPRequestHandler, body: bytes, params: dict[str, Any]):
        with self._lock:
            self.runs.append(params)
            rid = None if params.get("DryRun") else self._claim(params)
        answer = self._forward(handler, body)
        if answer[0] == 200 and self._next_paths and not params.get("DryRun"):
            for inst in parse_response("RunInstances", answer[2]).get("Instances", []):
                if self._next_paths:
                    self.set_topology(inst["InstanceId"], self._next_paths.pop(0), inst["InstanceType"],
                                      inst.get("Placement", {}).get("AvailabilityZone", "us-east-1a"))
        if rid:
            with self._lock:
                if answer[0] == 200:
                    for inst in parse_response("RunInstances", answer[2]).get("Instances", []):
                        self._held[inst["InstanceId"]] = rid
                else:
                    self.reservations[rid]["AvailableInstanceCount"] += int(params["MaxCount"])
        return answer

    def _claim(self, params: dict[str, Any]) -> str | None:
        """The reservation a launch goes into, its capacity taken; RequestError where EC2 refuses."""
        spec = params.get("CapacityReservationSpecification") or {}
        market = (params.get("InstanceMarketOptions") or {}).get("MarketType")
        target = (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
        if spec.get("CapacityReservationTarget") and spec.get("CapacityReservationPreference"):
            raise RequestError("InvalidParameterCombination", "give CapacityReservationPreference or "
                                                              "CapacityReservationTarget, not both")
        if market == "capacity-block" and not target:
            raise RequestError("MissingParameter", "MarketType capacity-block needs a CapacityReservationTarget")
        if target:
            return self._take(target, params, market)
        if spec.get("CapacityReservationPreference", "open") == "none":
            return None
        for rid, doc in self.reservations.items():  # open (or capacity-reservations-only): a matching open one
            try:
                if doc["InstanceMatchCriteria"] == "open":
                    return self._take(rid, params, market)
            except RequestError:
                continue
        if spec.get("CapacityReservationPreference") == "capacity-reservations-only":
            raise RequestError("InsufficientInstanceCapacity", "no open Capacity Reservation has that capacity")
        return None

    def _take(self, rid: str, params: dict[str, Any], market: str | None) -> str:
        if rid not in self.reservations:
            raise RequestError("InvalidCapacityReservationId.NotFound", f"The Capacity Reservation '{rid}' "
                                                                        "does not exist")
        doc, state = self.reservations[rid], self.reservation(rid)["State"]
        if state != "active":
            raise RequestError("IncorrectState", f"Capacity Reservation {rid} is {state}, not active")
        if (doc["ReservationType"] == "capacity-block") != (market == "capacity-block"):
            raise RequestError("InvalidParameterCombination", f"{rid} is a {doc['ReservationType']} reservation: "
                                                              "MarketType capacity-block goes with Capacity Blocks "
                                                              "only")
        az = (params.get("Placement") or {}).get("AvailabilityZone")
        if params.get("InstanceType") != doc["InstanceType"] or (az and az != doc["AvailabilityZone"]):
            raise RequestError("InvalidParameterCombination", f"{rid} holds {doc['InstanceType']} in "
                                                              f"{doc['AvailabilityZone']}")
        want = int(params["MaxCount"])
        if doc["AvailableInstanceCount"] < want:
            raise RequestError("ReservationCapacityExceeded", f"{rid} has {doc['AvailableInstanceCount']} "
                                                              f"free, {want} asked for")
        doc["AvailableInstanceCount"] -= want
        return rid

    def _release(self, instance_ids: list[str]) -> None:
        with self._lock:
            for iid in instance_ids:
                rid = self._held.pop(iid, None)
                if rid in self.reservations:
                    self.reservations[rid]["AvailableInstanceCount"] += 1

    def held_by(self, rid: str) -> list[str]:
        """Instances running in reservation ``rid`` (launched into it, not terminated)."""
        with self._lock:
            return sorted(i for i, r in self._held.items() if r == rid)

    # ---- the answered actions -------------------------------------------------------------------

    def _DescribeCapacityReservations(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        with self._lock:
            ids = params.get("CapacityReservationIds") or list(self.reservations)
            missing = [r for r in ids if r not in self.reservations]
            if missing:
                raise RequestError("InvalidCapacityReservationId.NotFound",
                                   f"The Capacity Reservation ID '{missing[0]}' does not exist")
            found = [self.reservation(r) for r in ids]
        return {"CapacityReservations": _filtered(found, params.get("Filters"), RESERVATION_FILTERS)}

    def _CreateCapacityReservation(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        tags = {t["Key"]: t["Value"] for s in params.get("TagSpecifications", []) for t in s.get("Tags", [])}
        doc = self.add_reservation(params["InstanceType"], params.get("AvailabilityZone") or f"{self.region}a",
                                   params["InstanceCount"], end=params.get("EndDate"),
                                   tenancy=params.get("Tenancy", "default"), platform=params["InstancePlatform"],
                                   match=params.get("InstanceMatchCriteria", "open"), tags=tags)
        return {"CapacityReservation": doc}

    def _DescribeCapacityBlockOfferings(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        def fits(o: dict[str, Any]) -> bool:
            return (o["CapacityBlockDurationHours"] == params["CapacityDurationHours"]
                    and params.get("InstanceType", o["InstanceType"]) == o["InstanceType"]
                    and params.get("InstanceCount", o["InstanceCount"]) == o["InstanceCount"]
                    and o["StartDate"] >= params.get("StartDateRange", o["StartDate"])
                    and o["EndDate"] <= params.get("EndDateRange", o["EndDate"]))
        with self._lock:
            return {"CapacityBlockOfferings": [dict(o) for o in self.offerings.values() if fits(o)]}

    def _PurchaseCapacityBlock(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        with self._lock:
            offer = self.offerings.pop(params["CapacityBlockOfferingId"], None)
        if offer is None:
            raise RequestError("InvalidParameterValue", f"offering {params['CapacityBlockOfferingId']} does not "
                                                        "exist (or was bought)")
        tags = {t["Key"]: t["Value"] for s in params.get("TagSpecifications", []) for t in s.get("Tags", [])}
        doc = self.add_reservation(offer["InstanceType"], offer["AvailabilityZone"], offer["InstanceCount"],
                                   start=offer["StartDate"], end=offer["EndDate"],
                                   platform=params["InstancePlatform"], reservation_type="capacity-block", tags=tags)
        return {"CapacityReservation": doc}

    def _DescribeInstanceTopology(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        with self._lock:
            ids = params.get("InstanceIds")
            found = [dict(d) for i, d in self.topology.items() if ids is None or i in ids]
        return {"Instances": _filtered(found, params.get("Filters"), TOPOLOGY_FILTERS)}


def _filtered(docs: list[dict[str, Any]], filters: list[dict[str, Any]] | None,
              known: dict[str, str]) -> list[dict[str, Any]]:
    for flt in filters or []:
        if flt["Name"] not in known:
            raise RequestError("InvalidParameterValue", f"The filter '{flt['Name']}' is invalid")
        key, values = known[flt["Name"]], set(flt.get("Values", []))
        docs = [d for d in docs if str(d.get(key)) in values]
    return docs
