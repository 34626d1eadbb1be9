"""The data of one copy run, shared by copy (planning), drive (transfers) and verify: no I/O here."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, jsonable
from clustertool.remote.transport import SSH, Transport
from clustertool.transfer.manifest import Keep, Manifest, is_unreachable
from clustertool.transfer.transferrequests import CopyRequest

ProgressCb = Callable[[str, int, int], None]  # (node, bytes done, bytes expected)


@dataclass
class NodeCopy:
    node: str
    status: str = "ok"             # ok | mismatch | failed | unreachable
    exit_code: int = 0
    bytes_received: int = 0        # payload bytes streamed to this node
    files_sent: int = 0
    files_checked: int = 0
    files_verified_in_stream: int = 0   # of files_checked, those hashed as written (no re-read)
    error: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class CopyResult:
    src: str
    dest: str
    source: str                     # "leader" (node name) or "local"
    strategy: str
    nodes: list[NodeCopy]
    total_bytes: int = 0            # size of the source tree
    total_files: int = 0
    bytes_sent: int = 0             # payload bytes that left the source (0 on a re-run)
    passes: int = 0                 # chain passes (1 + repairs)
    verified: bool = False
    verify: str = "stream"          # stream (hashes while writing, re-read the rest) | reread | off
    hash: str | None = None         # the hash algorithm source and nodes used
    source_errors: list[str] = field(default_factory=list)  # files the source could not send whole
    duration: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)

    def to_dict(self) -> dict:
        """What `copy --json` prints."""
        return {"exit_code": self.exit_code, **jsonable(self)}


def relative_remote(path: str) -> str:
    """A remote path as the node's shell would see it: '~/x' -> 'x' (ssh starts in $HOME)."""
    if path == "~":
        return "."
    if path.startswith("~/"):
        return path[2:] or "."
    if path.startswith("~"):
        raise UsageError(f"path {path!r}: '~user' paths are not supported", hint="use an absolute path")
    return path


@dataclass
class CopyRun:
    """One `copy` under way: its inputs, the source's manifest and every node's verdict so far."""

    cluster: ClusterRecord
    src: str
    dest: str
    from_local: bool
    targets: list[Node]
    delete: bool
    cipher: str | None
    on_progress: ProgressCb | None
    report: Reporter
    transport: Transport = SSH
    keep: Keep | None = None  # a filter on a local SRC's entries (run --sync's ignore rules)
    verify: bool = True
    asked: CopyRequest | None = None  # what the user asked, as typed (for the hint of a SRC not found)
    unwritable_says: Callable[[str, str, str], ToolError] | None = None  # the caller's words for an unwritable DEST
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    source: Manifest | None = None
    results: dict[str, NodeCopy] = field(default_factory=dict)
    algo: str | None = None         # the hash for this run (the source's fastest)
    streamed: dict[str, set[str]] = field(default_factory=dict)          # node -> files verified in the stream
    stream_problems: dict[str, list[str]] = field(default_factory=dict)  # node -> files the stream got wrong
    covered: dict[str, set[str]] = field(default_factory=dict)           # node -> entries it wrote from the stream
    ahead: list[str] | None = None   # the chain prepared in the survey (pass 0), in order, until used or discarded
    cleanups: list = field(default_factory=list)                         # background take-downs to wait for
    source_errors: list[str] = field(default_factory=list)               # files the source could not send whole

    @property
    def session(self) -> ClusterSession:
        """The cluster and the transport, as the functions that reach nodes take them."""
        return ClusterSession(self.cluster, self.transport)

    @property
    def stream_algo(self) -> str | None:
        """The hash the relay computes while copying: none when not verifying."""
        return self.algo if self.verify else None

    @property
    def manifest(self) -> Manifest:
        """The source's manifest: every step after the survey, which reads it, uses it."""
        assert self.source is not None, "the survey reads the source's manifest first"
        return self.source

    @property
    def src_dir(self) -> str:
        return self.src if self.manifest.is_dir else (os.path.dirname(self.src.rstrip("/")) or ".")

    def entry(self, name: str) -> NodeCopy:
        """The node's verdict, made (ok, so far) on first use."""
        return self.results.setdefault(name, NodeCopy(name))

    def fail(self, name: str, error: str) -> None:
        """Record a node's failure: unreachable (255) when the transport said so, else failed (1)."""
        entry = self.entry(name)
        unreachable = is_unreachable(error)
        entry.status = "unreachable" if unreachable else "failed"
        entry.exit_code = 255 if unreachable else 1
        entry.error = error
