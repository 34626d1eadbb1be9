"""The bucket as the control machine sees it for `sync-s3`: listing, what lands where, presigned URLs.

Only this machine holds AWS credentials (boto3's usual chain: environment, profile, SSO, role).
Nodes get presigned GET URLs (botocore's ``generate_presigned_url``, SigV4, short-lived): one URL
lets its holder GET one object until it expires, and carries no secret key.  boto3 is imported
lazily, so ``clustertool --help`` stays fast.
"""

from __future__ import annotations

import builtins
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from clustertool.core.errors import ToolError, UsageError

MAX_EXPIRY = 7 * 24 * 3600  # what SigV4 presigned URLs allow
SIZE_ONLY = -1


@dataclass
class S3Object:
    key: str
    rel: str            # where it lands under DEST
    size: int
    etag: str           # without quotes
    mtime: int          # LastModified, epoch seconds (the file's mtime on the node)

    @property
    def multipart(self) -> bool:
        return "-" in self.etag

    def row(self, check: int | None) -> list:
        """The node program's view: [rel, size, etag, mtime, check]."""
        return [self.rel, self.size, self.etag, self.mtime, check]


def parse_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise UsageError(f"not an S3 URL: {url!r}", hint="use s3://bucket/prefix")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise UsageError(f"no bucket in {url!r}", hint="use s3://bucket/prefix")
    return bucket, prefix


def folder_prefix(prefix: str) -> str:
    """``ds`` means the folder ``ds/`` (as with ``aws s3 sync``); "" is the whole bucket."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")


def parse_duration(text: str | int) -> int:
    """Seconds from ``900``, ``90s``, ``15m``, ``2h`` or ``1d``; within what presigned URLs allow."""
    match = _DURATION.match(str(text))
    if not match:
        raise UsageError(f"--url-expiry: not a duration: {text!r}", hint="e.g. 900, 15m, 2h")
    seconds = int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if not 1 <= seconds <= MAX_EXPIRY:
        raise UsageError(f"--url-expiry {text}: presigned URLs live 1 s to 7 days", hint="e.g. 15m")
    return seconds


def local_name(key: str, prefix: str) -> str | None:
    """Path of an object under DEST: the key minus the prefix; None when unsafe or a folder marker."""
    rel = key[len(prefix):] if key.startswith(prefix) else key
    rel = rel.lstrip("/")
    parts = rel.split("/")
    if not rel or rel.endswith("/") or any(p in ("..", ".") for p in parts) or "\0" in rel:
        return None
    return rel


def shard_of(objects: list, index: int, count: int) -> list:
    """Node ``index`` of ``count`` gets every count-th object of the key-sorted listing: disjoint, complete."""
    return sorted(objects, key=lambda o: o.key)[index::count]


def part_check(size: int, parts: int | None, part_size: int | None) -> int:
    """How a multipart object is verified: its part size when the parts are equal but the last
    (what boto3, the AWS CLI, s3cmd and rclone write), else size only."""
    if not parts or not part_size or part_size <= 0:
        return SIZE_ONLY
    return part_size if (parts - 1) * part_size < size <= parts * part_size else SIZE_ONLY


class Bucket:
    """One bucket through boto3: list, ask a multipart object's part size, presign GETs (cached)."""

    def __init__(self, bucket: str, endpoint: str | None, region: str | None, expiry: int):
        self.name, self.endpoint, self.expiry = bucket, endpoint, expiry
        self.client = self._client(region)
        self._urls: dict[str, tuple[str, float]] = {}
        self._checks: dict[str, int] = {}
        self._lock = threading.Lock()

    def _client(self, region: str | None) -> Any:  # a boto3 S3 client (boto3-stubs left out)
        import boto3
        from botocore.config import Config

        style = "path" if self.endpoint else "auto"
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, region_name=region or None,
                            config=Config(signature_version="s3v4", s3={"addressing_style": style},
                                          retries={"mode": "standard"}))

    def locate(self) -> None:
        """Check the bucket exists and is ours to read; sign for its own region (URLs must)."""
        from botocore.exceptions import ClientError

        try:
            headers = self.client.head_bucket(Bucket=self.name)["ResponseMetadata"]["HTTPHeaders"]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            if code in ("404", "NoSuchBucket"):
                raise ToolError(f"s3://{self.name}: no such bucket",
                                hint="check the name (`aws s3 ls` lists yours) and --endpoint-url") from None
            if code in ("403", "AccessDenied") and not headers.get("x-amz-bucket-region"):
                raise ToolError(f"s3://{self.name}: access denied (403) to this machine's credentials",
                                hint="they need s3:ListBucket and s3:GetObject; nodes need none") from None
            if not headers.get("x-amz-bucket-region"):
                raise _tool_error(exc, f"s3://{self.name}") from None
        except Exception as exc:
            raise _tool_error(exc, f"s3://{self.name}") from None
        region = headers.get("x-amz-bucket-region")
        if region and not self.endpoint and region != self.client.meta.region_name:
            self.client = self._client(region)

    def list(self, prefix: str) -> list[dict]:
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
            return [c for page in pages for c in page.get("Contents", [])]
        except Exception as exc:
            raise _tool_error(exc, f"s3://{self.name}/{prefix}") from None

    def siblings(self, prefix: str, limit: int = 5) -> builtins.list[str]:  # builtins: list is a method here
        """Up to ``limit`` names beside a prefix that matched nothing (for the hint)."""
        parent = prefix.rstrip("/").rpartition("/")[0]
        parent = parent + "/" if parent else ""
        try:
            page = self.client.list_objects_v2(Bucket=self.name, Prefix=parent, Delimiter="/", MaxKeys=limit)
        except Exception:
            return []
        names = [p["Prefix"] for p in page.get("CommonPrefixes", [])] + [c["Key"] for c in page.get("Contents", [])]
        return names[:limit]

    def check(self, obj: S3Object) -> int:
        """0: the ETag is an MD5; a part size: a multipart ETag we can recompute; -1: size only."""
        if not obj.multipart:
            return 0
        with self._lock:
            if obj.key in self._checks:
                return self._checks[obj.key]
        try:
            head = self.client.head_object(Bucket=self.name, Key=obj.key, PartNumber=1)
            check = part_check(obj.size, head.get("PartsCount"), head.get("ContentLength"))
        except Exception:
            check = SIZE_ONLY
        with self._lock:
            self._checks[obj.key] = check
        return check

    def checks(self, objects: builtins.list[S3Object]) -> dict[str, int]:
        multipart = [o for o in objects if o.multipart]
        if multipart:
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(self.check, multipart))
        return {o.key: self.check(o) for o in objects}

    def url(self, key: str, renewal: bool = False) -> str:
        """A presigned GET.  Nodes ask together, so one made lately is shared: within a quarter of
        its life, or for a renewal (the node's URL expired) within the last few seconds."""
        now = time.monotonic()
        max_age = min(5.0, self.expiry / 4) if renewal else self.expiry / 4
        with self._lock:
            cached = self._urls.get(key)
            if cached and now - cached[1] < max_age:
                return cached[0]
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": self.name, "Key": key},
                                                 ExpiresIn=self.expiry)
        with self._lock:
            self._urls[key] = (url, now)
        return url


def _tool_error(exc: Exception, what: str) -> ToolError:
    """boto3's failures as one line (never a credential)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return ToolError(f"{what}: no AWS credentials on this machine",
                         hint="this machine lists and presigns (nodes need none): set AWS_PROFILE, "
                              "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or run `aws configure`")
    if isinstance(exc, EndpointConnectionError):
        return ToolError(f"{what}: cannot reach the endpoint ({exc})", hint="check --endpoint-url / AWS_ENDPOINT_URL")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return ToolError(f"{what}: {err.get('Code', '?')} {err.get('Message', '')}".rstrip())
    return ToolError(f"{what}: {type(exc).__name__}: {exc}")
