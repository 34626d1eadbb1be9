"""The lease of an `up` in flight: a tag saying until when the `up` that makes a cluster is alive.

Every resource `up` creates carries ``clustertool:lease=<epoch second>``; while it runs, `up`
moves the lease forward on its security group (the first thing it creates) on every AWS call
once a quarter of the lease has passed, and marks ``done`` when it finished.  A sweep never
deletes a cluster whose lease is live; an expired lease means that `up` died, and its leftovers
are fair game.
"""

from __future__ import annotations

import os
import time

from clustertool.providers.aws import tags
from clustertool.providers.aws.client import Aws, aws_errors


def seconds() -> float:
    """How long a lease lasts without being refreshed (CLUSTERTOOL_AWS_LEASE, default 600 s)."""
    try:
        return max(0.1, float(os.environ.get("CLUSTERTOOL_AWS_LEASE") or 600.0))
    except ValueError:
        return 600.0


def expiry(now: float | None = None) -> str:
    return f"{(time.time() if now is None else now) + seconds():.0f}"


def summarize(values: list[str]) -> str | float | None:
    """The lease of a cluster from its resources' tags: 'done', the latest expiry, or None (no lease)."""
    if tags.DONE in values:
        return tags.DONE
    stamps = []
    for value in values:
        try:
            stamps.append(float(value))
        except (TypeError, ValueError):
            continue
    return max(stamps) if stamps else None


def live(lease: str | float | None, now: float | None = None) -> bool:
    """An `up` still in flight: a numeric lease that has not expired."""
    return isinstance(lease, float) and lease > (time.time() if now is None else now)


def describe(lease: str | float | None, now: float | None = None) -> str:
    now = time.time() if now is None else now
    if lease == tags.DONE:
        return "up finished"
    if lease is None:
        return "no lease (made before leases)"
    assert not isinstance(lease, str), lease  # summarize gives DONE, an expiry or None
    if lease > now:
        return f"up in flight (lease for {lease - now:.0f}s more)"
    return f"up died (lease expired {now - lease:.0f}s ago)"


class Lease:
    """Refreshes the lease of the `up` that holds it; install with ``aws.tick = lease.beat``."""

    def __init__(self, aws: Aws):
        self.aws = aws
        self.resource: str | None = None
        self.last = time.monotonic()

    def hold(self, resource_id: str) -> None:
        self.resource = resource_id
        self.last = time.monotonic()

    def beat(self) -> None:
        if self.resource and time.monotonic() - self.last >= seconds() / 4:
            self.last = time.monotonic()
            with aws_errors("refreshing the up's lease"):
                self.aws.call("create_tags", Resources=[self.resource], Tags=tags.pairs({tags.LEASE: expiry()}))

    def done(self, resource_ids: list[str]) -> None:
        """Mark the cluster complete (``up`` finished); fails if its resources were removed meanwhile."""
        self.aws.tick = None
        ids = [r for r in resource_ids if r]
        if ids:
            with aws_errors("marking the cluster complete"):
                self.aws.call("create_tags", Resources=ids, Tags=tags.pairs({tags.LEASE: tags.DONE}))
