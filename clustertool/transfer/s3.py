"""`sync-s3`: every selected node pulls s3://bucket/prefix into DEST itself, all at once.

Each node runs ``nodeprogs/s3.py`` (sent on ssh stdin with its arguments): boto3 when the node
has it, else a stdlib S3 client.  Credentials: the node's own chain (environment, ~/.aws,
instance role), or this machine's passed in the stdin payload (never on a command line).
``shard``: node i of N takes every N-th object of the sorted listing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from clustertool import nodeset, state
from clustertool.errors import UsageError
from clustertool.model import HostResult, Reporter, silent
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import SSH, Transport
from clustertool.transfer import manifest as mf
from clustertool.transfer.model import relative_remote


@dataclass
class NodeSync:
    node: str
    status: str = "ok"          # ok | failed | unreachable
    exit_code: int = 0
    objects: int = 0
    downloaded: int = 0
    bytes_downloaded: int = 0
    verified: int = 0
    client: str | None = None
    shard: list[int] | None = None
    error: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class SyncResult:
    url: str
    dest: str
    shard: bool
    nodes: list[NodeSync]
    duration: float = 0.0

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)


def parse_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise UsageError(f"not an S3 URL: {url!r}", hint="use s3://bucket/prefix")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise UsageError(f"no bucket in {url!r}", hint="use s3://bucket/prefix")
    return bucket, prefix


def local_credentials() -> dict | None:
    """This machine's resolved AWS credentials (env, profile, SSO...), for --pass-credentials."""
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return {"key": os.environ["AWS_ACCESS_KEY_ID"], "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
                "token": os.environ.get("AWS_SESSION_TOKEN")}
    import boto3

    creds = boto3.Session().get_credentials()
    if creds is None:
        raise UsageError("--pass-credentials: no AWS credentials found on this machine",
                         hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or configure a profile")
    frozen = creds.get_frozen_credentials()
    return {"key": frozen.access_key, "secret": frozen.secret_key, "token": frozen.token}


def node_args(bucket: str, prefix: str, dest: str, shard: list[int] | None, endpoint: str | None,
              region: str | None, creds: dict | None) -> dict:
    args = {"bucket": bucket, "prefix": prefix, "dest": dest, "shard": shard,
            "endpoint": endpoint, "region": region}
    if creds:
        args["creds"] = creds
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        args["no_imds"] = True  # as boto3: never ask instance metadata for credentials
    return args


def _verdict(r: HostResult, shard: list[int] | None) -> NodeSync:
    out = NodeSync(r.node, shard=shard)
    payload = None
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            try:
                payload = json.loads(line)
            except ValueError:
                pass
            break
    if payload is None:
        unreachable = r.error is not None and mf.is_unreachable(r.error)
        out.status, out.exit_code = ("unreachable", 255) if unreachable else ("failed", max(1, r.effective_code))
        out.error = r.reason or "the node program printed no result"
        return out
    if payload.get("fatal"):
        out.status, out.exit_code, out.error = "failed", 1, payload["fatal"]
        return out
    out.objects, out.downloaded = payload["objects"], payload["downloaded"]
    out.bytes_downloaded, out.verified = payload["bytes"], payload["verified"]
    out.client, out.errors = payload.get("client"), payload.get("errors", [])
    if out.errors:
        out.status, out.exit_code = "failed", 1
        out.error = f"{len(out.errors)} object(s) failed: {mf.summarize(out.errors, 3)}"
    return out


def sync_s3(cluster_name: str, url: str, dest: str, *, selection: str | None = None, shard: bool = False,
            endpoint_url: str | None = None, pass_credentials: bool = False, region: str | None = None,
            timeout: float | None = None, report: Reporter = silent, transport: Transport = SSH) -> SyncResult:
    started = time.monotonic()
    bucket, prefix = parse_url(url)
    cluster = state.ready_cluster(cluster_name)
    nodes = sorted(nodeset.select(cluster, selection), key=lambda n: n.index)
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    creds = local_credentials() if pass_credentials else None
    shards = {n.name: [i, len(nodes)] if shard else None for i, n in enumerate(nodes)}
    report(f"{len(nodes)} node(s) pulling s3://{bucket}/{prefix}" + (" (sharded)" if shard else "")
           + (f" from {endpoint}" if endpoint else ""))
    group = run_on_nodes(
        cluster.name, nodes, python_command(), timeout=timeout, transport=transport,
        stdin_data=lambda n: program_text("s3", node_args(
            bucket, prefix, relative_remote(dest), shards[n.name], endpoint, region, creds)))
    return SyncResult(url, dest, shard, [_verdict(r, shards[r.node]) for r in group.results],
                      time.monotonic() - started)
