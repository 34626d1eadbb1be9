"""`sync-s3`: every selected node downloads s3://bucket/prefix into DEST itself, all at once.

This machine lists the prefix with boto3 and hands each node presigned GET URLs (short-lived,
``url_expiry``); no credentials ever reach a node.  Each node runs ``nodeprogs/s3.py`` in a
session (remote/session.py): it gets its share of the listing, answers with what it lacks, gets
URLs for exactly those, downloads them on ``threads`` threads (resumable, verified against the
ETag while written) and reports progress.  A URL rejected as expired is renewed here and the node
goes on.  ``shard``: node i of N takes every N-th object of the key-sorted listing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError
from clustertool.core.model import HostResult, Node
from clustertool.nodeprogs import program_stream, stream_command
from clustertool.remote.dialog import run_sessions
from clustertool.sharedfs import mount
from clustertool.transfer import manifest
from clustertool.transfer.results import ProgressCb, relative_remote
from clustertool.transfer.s3bucket import Bucket, S3Object, folder_prefix, local_name, parse_url, shard_of
from clustertool.transfer.transferrequests import SyncS3Request


@dataclass
class NodeSync:
    node: str
    status: str = "ok"          # ok | failed | unreachable
    exit_code: int = 0
    objects: int = 0            # this node's share
    up_to_date: int = 0         # already there (size, ETag, mtime as recorded): not fetched
    downloaded: int = 0
    bytes_downloaded: int = 0   # over the network this run
    bytes_resumed: int = 0      # taken from partial files of an earlier, interrupted run
    verified: int = 0           # downloaded and matched against the ETag (MD5, or MD5 of the parts)
    size_only: int = 0          # downloaded, checked by size only (SSE-KMS, odd multipart parts)
    rechecked: int = 0
    renewals: int = 0           # times the node asked for fresh URLs
    seconds: float = 0.0
    shard: list[int] | None = None
    error: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class SyncResult:
    url: str
    dest: str
    shard: bool
    objects: int                # in the listing
    total_bytes: int
    url_expiry: int
    threads: int
    nodes: list[NodeSync]
    skipped_keys: list[str] = field(default_factory=list)  # keys with no safe local name
    duration: float = 0.0

    @property
    def exit_code(self) -> int:
        return max([n.exit_code for n in self.nodes] + [1 if self.skipped_keys else 0])

    @property
    def bytes_downloaded(self) -> int:
        return sum(n.bytes_downloaded for n in self.nodes)


@dataclass
class _NodeTalk:
    """What one node said, as it said it (written by its session's reader thread)."""

    objects: list[S3Object]
    total: int = 0
    renewals: int = 0
    result: dict | None = None


def node_args(dest: str, threads: int, expiry: int, recheck: bool) -> dict:
    """ARGS of nodeprogs/s3.py: no bucket, no endpoint, no credentials (the URLs say where)."""
    return {"dest": dest, "threads": threads, "expiry": expiry, "recheck": recheck}


def listing(bucket: Bucket, prefix: str) -> tuple[list[S3Object], list[str]]:
    """The objects under ``prefix`` with their local names, and the keys that have none (unsafe).

    ``ds`` means the folder ``ds/``; a prefix that is exactly one object's key means that object."""
    folder = folder_prefix(prefix)
    raw = bucket.list(folder)
    base = folder
    if not raw and prefix and not prefix.endswith("/"):
        raw = [c for c in bucket.list(prefix) if c["Key"] == prefix]
        base = prefix.rpartition("/")[0] + "/" if "/" in prefix else ""
    objects, skipped = [], []
    for c in raw:
        if c["Key"].endswith("/") and c["Size"] == 0:
            continue  # a folder marker
        rel = local_name(c["Key"], base)
        if rel is None:
            skipped.append(c["Key"])
            continue
        objects.append(S3Object(c["Key"], rel, c["Size"], c["ETag"].strip('"'), int(c["LastModified"].timestamp())))
    return objects, skipped


def _empty_prefix(bucket: Bucket, prefix: str) -> ToolError:
    near = bucket.siblings(prefix)
    hint = (f"beside it: {', '.join(near)}" if near else "the bucket has nothing there either") + \
        " (keys are case-sensitive)"
    return ToolError(f"s3://{bucket.name}/{prefix}: no objects under this prefix", hint=hint)


def _verdict(r: HostResult, talk: _NodeTalk, shard: list[int] | None) -> NodeSync:
    out = NodeSync(r.node, shard=shard, objects=len(talk.objects), renewals=talk.renewals,
                   seconds=round(r.duration, 3))
    res = talk.result
    if res is None:
        unreachable = r.error is not None and manifest.is_unreachable(r.error)
        out.status, out.exit_code = ("unreachable", 255) if unreachable else ("failed", max(1, r.effective_code))
        out.error = r.reason or "the node program ended without a result"
        return out
    out.up_to_date, out.downloaded = res.get("up_to_date", 0), res.get("downloaded", 0)
    out.bytes_downloaded, out.bytes_resumed = res.get("bytes", 0), res.get("resumed", 0)
    out.verified, out.size_only = res.get("verified", 0), res.get("size_only", 0)
    out.rechecked = res.get("rechecked", 0)
    out.errors = list(res.get("errors", []))
    if res.get("fatal"):
        out.status, out.exit_code, out.error = "failed", 1, res["fatal"]
    elif out.errors:
        out.status, out.exit_code = "failed", 1
        out.error = f"{len(out.errors)} object(s) failed: {manifest.summarize(out.errors, 3)}"
    return out


class _Conversation:
    """This machine's side of every node's session: URLs on request, renewals, progress."""

    def __init__(self, bucket: Bucket, talks: dict[str, _NodeTalk], on_progress: ProgressCb | None):
        self.bucket, self.talks, self.on_progress = bucket, talks, on_progress

    def _urls(self, talk: _NodeTalk, indices: list[int], renewal: bool) -> dict:
        objs = [talk.objects[i] for i in indices]
        self.bucket.checks(objs)
        return {str(i): [self.bucket.url(o.key, renewal=renewal), self.bucket.check(o)] for i, o in zip(indices, objs)}

    def __call__(self, node: str, msg: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        talk = self.talks[node]
        if "p" in msg:
            if self.on_progress is not None:
                self.on_progress(node, min(int(msg["p"]), talk.total), talk.total)
        elif "need" in msg:
            talk.total = int(msg.get("bytes", 0))
            if self.on_progress is not None:
                self.on_progress(node, 0, talk.total)
            reply({"urls": self._urls(talk, [int(i) for i in msg["need"]], renewal=False)})
        elif "renew" in msg:
            talk.renewals += 1
            reply({"urls": self._urls(talk, [int(i) for i in msg["renew"]], renewal=True)})
        elif "result" in msg:
            talk.result = msg["result"]


def sync_s3(session: ClusterSession, request: SyncS3Request, *, on_progress: ProgressCb | None = None) -> SyncResult:
    """Every selected node pulls the request's prefix (progress lines: the session's reporter)."""
    started = time.monotonic()
    report, url, dest, shard, selection = session.report, request.url, request.dest, request.shard, request.nodes
    threads, url_expiry, recheck = request.threads, request.url_expiry, request.recheck
    bucket_name, prefix = parse_url(url)
    cluster = session.ready()
    shared = mount.mount_under(cluster, dest)
    if shared and not shard:  # every node sees DEST: one node pulls it (--shard: each a disjoint part)
        selection = "leader"
        report(mount.write_once_line(cluster, dest, shared))
    nodes = sorted(nodeset.select(cluster, selection), key=lambda n: n.index)
    endpoint = request.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    region = request.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    remote_dest = relative_remote(dest)
    bucket = Bucket(bucket_name, endpoint, region, url_expiry)
    bucket.locate()
    objects, skipped = listing(bucket, prefix)
    if not objects:
        raise _empty_prefix(bucket, prefix) if not skipped else ToolError(
            f"{url}: no object has a safe local name ({len(skipped)} skipped, e.g. {skipped[0]!r})")
    total = sum(o.size for o in objects)
    shards = {n.name: [i, len(nodes)] if shard else None for i, n in enumerate(nodes)}
    talks = {n.name: _NodeTalk(shard_of(objects, i, len(nodes)) if shard else sorted(objects, key=lambda o: o.key))
             for i, n in enumerate(nodes)}
    checks = bucket.checks(objects) if recheck else {}
    report(f"{len(nodes)} node(s) pulling {len(objects)} object(s), {total} bytes, from s3://{bucket_name}/{prefix}"
           + (" (sharded)" if shard else "") + (f" at {endpoint}" if endpoint else "")
           + f"; presigned URLs live {url_expiry}s")

    def opening(node: Node) -> bytes:
        rows = [o.row(checks.get(o.key)) for o in talks[node.name].objects]
        return program_stream("s3", node_args(remote_dest, threads, url_expiry, recheck), lib=("s3lib",)) + \
            (json.dumps({"objects": rows}) + "\n").encode()

    group = run_sessions(session, nodes, stream_command(), opening=opening,
                         on_message=_Conversation(bucket, talks, on_progress), timeout=request.timeout)
    return SyncResult(url, dest, shard, len(objects), total, url_expiry, threads,
                      [_verdict(r, talks[r.node], shards[r.node]) for r in group.results],
                      skipped, time.monotonic() - started)

