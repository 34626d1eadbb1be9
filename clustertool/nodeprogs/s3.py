"""Standalone program run on a node (``python3 -``, source on ssh stdin): pull an S3 prefix.

Uses boto3 when the node has it, else a small stdlib S3 client (SigV4, ListObjectsV2,
GetObject), so a bare node with python3 works too.  ``ARGS`` (prepended by the sender):
bucket, prefix, dest, shard [i, n] or null, endpoint, region, creds (optional dict).
Incremental: an object whose file has the same size and mtime (= LastModified) is skipped.
Every file is then checked: size, and MD5 against the ETag for single-part uploads.
Prints one JSON line with counts and errors.  Credentials never appear in output.
"""

import datetime
import hashlib
import hmac
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

CHUNK = 1 << 20


def _creds_from_env_or_file(args):
    c = args.get("creds")
    if c:
        return c
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return {"key": os.environ["AWS_ACCESS_KEY_ID"], "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
                "token": os.environ.get("AWS_SESSION_TOKEN")}
    import configparser

    cp = configparser.ConfigParser()
    cp.read(os.path.expanduser(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")))
    profile = os.environ.get("AWS_PROFILE", "default")
    if cp.has_section(profile) and cp.has_option(profile, "aws_access_key_id"):
        return {"key": cp.get(profile, "aws_access_key_id"), "secret": cp.get(profile, "aws_secret_access_key"),
                "token": cp.get(profile, "aws_session_token", fallback=None)}
    if args.get("no_imds") or os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        raise RuntimeError("no AWS credentials on this node (environment, ~/.aws/credentials; "
                           "instance metadata disabled)")
    try:
        return _creds_from_instance_role()
    except OSError as exc:
        raise RuntimeError(f"no AWS credentials on this node and no instance role ({exc})") from None


def _creds_from_instance_role():
    """EC2 instance role via IMDSv2 (only reached on nodes with no other credentials)."""
    base = "http://169.254.169.254/latest"
    req = urllib.request.Request(base + "/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    token = urllib.request.urlopen(req, timeout=2).read().decode()
    hdr = {"X-aws-ec2-metadata-token": token}
    path = base + "/meta-data/iam/security-credentials/"
    role = urllib.request.urlopen(urllib.request.Request(path, headers=hdr), timeout=2).read().decode().split()[0]
    data = json.loads(urllib.request.urlopen(urllib.request.Request(path + role, headers=hdr), timeout=2).read())
    return {"key": data["AccessKeyId"], "secret": data["SecretAccessKey"], "token": data.get("Token")}


def _sign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class StdlibS3:
    """Just enough S3: signed GETs (SigV4, path-style for custom endpoints)."""

    name = "stdlib"

    def __init__(self, args):
        self.region = args.get("region") or "us-east-1"
        self.endpoint = (args.get("endpoint") or f"https://s3.{self.region}.amazonaws.com").rstrip("/")
        self.creds = _creds_from_env_or_file(args)

    def _request(self, bucket, key="", query=None):
        q = sorted((query or {}).items())
        uri = "/" + urllib.parse.quote(bucket, safe="") + "/" + urllib.parse.quote(key, safe="/-_.~")
        if not key:
            uri = uri.rstrip("/") if query else uri
        qs = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}" for k, v in q)
        host = urllib.parse.urlsplit(self.endpoint).netloc
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": amz_date}
        if self.creds.get("token"):
            headers["x-amz-security-token"] = self.creds["token"]
        signed = ";".join(sorted(headers))
        canonical = "\n".join(["GET", uri, qs, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                               signed, "UNSIGNED-PAYLOAD"])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = _sign(("AWS4" + self.creds["secret"]).encode(), day)
        for part in (self.region, "s3", "aws4_request"):
            k = _sign(k, part)
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.creds['key']}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={sig}")
        del headers["host"]
        url = self.endpoint + uri + ("?" + qs if qs else "")
        try:
            return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            code = body.split("<Code>")[1].split("</Code>")[0] if "<Code>" in body else ""
            raise RuntimeError(f"S3 {exc.code} {code or exc.reason} for s3://{bucket}/{key}") from None

    def list(self, bucket, prefix):
        out, token = [], None
        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            root = ET.fromstring(self._request(bucket, "", query).read())
            for c in root.iter(ns + "Contents"):
                modified = datetime.datetime.strptime(c.find(ns + "LastModified").text[:19], "%Y-%m-%dT%H:%M:%S")
                out.append({"key": c.find(ns + "Key").text, "size": int(c.find(ns + "Size").text),
                            "etag": (c.find(ns + "ETag").text or "").strip('"'),
                            "mtime": int(modified.replace(tzinfo=datetime.timezone.utc).timestamp())})
            if (root.findtext(ns + "IsTruncated") or "false") != "true":
                return out
            token = root.findtext(ns + "NextContinuationToken")

    def get(self, bucket, key, path):
        with self._request(bucket, key) as resp, open(path, "wb") as fh:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                fh.write(block)


class Boto3S3:
    name = "boto3"

    def __init__(self, args):
        import boto3

        c = args.get("creds") or {}
        self.client = boto3.client("s3", endpoint_url=args.get("endpoint"), region_name=args.get("region") or None,
                                   aws_access_key_id=c.get("key"), aws_secret_access_key=c.get("secret"),
                                   aws_session_token=c.get("token"))

    def list(self, bucket, prefix):
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for c in page.get("Contents", []):
                out.append({"key": c["Key"], "size": c["Size"], "etag": c["ETag"].strip('"'),
                            "mtime": int(c["LastModified"].timestamp())})
        return out

    def get(self, bucket, key, path):
        self.client.download_file(bucket, key, path)


def make_client(args):
    try:
        import boto3  # noqa: F401
    except ImportError:
        return StdlibS3(args)
    return Boto3S3(args)


def local_name(key, prefix):
    """Path of an object under DEST: the key minus the prefix; None when unsafe."""
    rel = key[len(prefix):] if key.startswith(prefix) else key
    rel = rel.lstrip("/")
    parts = rel.split("/")
    if not rel or any(p in ("..", ".") for p in parts if p) or "\0" in rel:
        return None
    return rel


def shard_of(objects, shard):
    """Node i of n gets every n-th object of the key-sorted listing: disjoint, complete."""
    objects = sorted(objects, key=lambda o: o["key"])
    if not shard:
        return objects
    i, n = shard
    return objects[i::n]


def md5_of(path):
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def check(obj, path):
    st = os.stat(path)
    if st.st_size != obj["size"]:
        return f"size {st.st_size} != {obj['size']}"
    if obj["etag"] and "-" not in obj["etag"] and md5_of(path) != obj["etag"]:
        return "MD5 differs from the ETag"
    return None


def sync(args):
    dest = os.path.expanduser(args["dest"])
    out = {"objects": 0, "downloaded": 0, "bytes": 0, "verified": 0, "errors": [], "client": None}
    s3 = make_client(args)
    out["client"] = s3.name
    objects = [o for o in shard_of(s3.list(args["bucket"], args["prefix"]), args.get("shard"))
               if not o["key"].endswith("/")]
    out["objects"] = len(objects)
    for obj in objects:
        rel = local_name(obj["key"], args["prefix"])
        if rel is None:
            out["errors"].append(f"unsafe key skipped: {obj['key']!r}")
            continue
        path = os.path.join(dest, rel)
        try:
            st = os.stat(path) if os.path.exists(path) else None
            if st is None or st.st_size != obj["size"] or int(st.st_mtime) != obj["mtime"]:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".ctpart")
                s3.get(args["bucket"], obj["key"], tmp)
                os.utime(tmp, (obj["mtime"], obj["mtime"]))
                os.replace(tmp, path)
                out["downloaded"] += 1
                out["bytes"] += obj["size"]
            problem = check(obj, path)
            if problem:
                out["errors"].append(f"{rel}: {problem}")
            else:
                out["verified"] += 1
        except Exception as exc:  # one object's failure is reported, the rest go on
            out["errors"].append(f"{rel}: {type(exc).__name__}: {exc}")
    return out


if __name__ == "__main__" and "ARGS" in globals():
    try:
        result = sync(ARGS)  # noqa: F821
    except Exception as exc:
        result = {"fatal": str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    sys.exit(0 if not result.get("fatal") and not result.get("errors") else 1)
