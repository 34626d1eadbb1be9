"""What a user asks of `copy` and `sync-s3`, as one typed value each: built alike by the CLI and the API,
checked once when made (a bad value is one UsageError naming the flag, with a hint)."""

from __future__ import annotations

from dataclasses import dataclass

from clustertool.core.errors import UsageError
from clustertool.transfer.chain import DEFAULT_CIPHER
from clustertool.transfer.s3bucket import MAX_EXPIRY, parse_url

STRATEGIES = ("auto", "chain", "fanout")
DEFAULT_THREADS = 8  # downloads at once on each node
DEFAULT_EXPIRY = 900  # seconds a presigned URL lives


@dataclass(frozen=True)
class CopyRequest:
    """One `clustertool copy SRC DEST`: from the leader (or ``source="local"``, from here) onto the
    selected nodes (default: the members from the leader, every node from here)."""

    src: str
    dest: str
    source: str = "leader"  # --from
    nodes: str | None = None
    strategy: str = "auto"  # auto, chain (pipelined relay) or fanout (parallel rsync)
    verify: bool = True
    verify_only: bool = False
    delete: bool = False
    cipher: str | None = DEFAULT_CIPHER  # ssh's cipher between nodes; None (or ""): ssh's default

    def __post_init__(self) -> None:
        if self.source not in ("leader", "local"):
            raise UsageError(f"--from must be leader or local, not {self.source!r}",
                             hint="--from local for a path on this machine, --from leader (the default) for one there")
        if self.verify_only and not self.verify:
            raise UsageError("--verify-only and --no-verify contradict each other")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"--strategy {self.strategy!r}: use auto, chain or fanout",
                             hint="e.g. --strategy chain (auto picks by size and nodes)")
        if self.cipher == "":
            object.__setattr__(self, "cipher", None)


@dataclass(frozen=True)
class SyncS3Request:
    """One `clustertool sync-s3 s3://BUCKET/PREFIX DEST`: every selected node pulls the prefix into DEST."""

    url: str
    dest: str
    nodes: str | None = None
    shard: bool = False  # node i of N gets a disjoint 1/N of the objects
    endpoint_url: str | None = None  # default: AWS_ENDPOINT_URL, else AWS
    region: str | None = None  # default: AWS_REGION / AWS_DEFAULT_REGION, else the bucket's
    threads: int = DEFAULT_THREADS
    url_expiry: int = DEFAULT_EXPIRY  # seconds
    recheck: bool = False  # re-hash files that look up to date
    timeout: float | None = None

    def __post_init__(self) -> None:
        parse_url(self.url)
        if not 1 <= self.threads <= 64:
            raise UsageError(f"--threads {self.threads}: give 1 to 64 (downloads at once on each node)")
        if not 1 <= self.url_expiry <= MAX_EXPIRY:
            raise UsageError(f"--url-expiry {self.url_expiry}: presigned URLs live 1 s to 7 days", hint="e.g. 15m")
