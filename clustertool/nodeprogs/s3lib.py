"""Helpers of nodeprogs/s3.py (stdlib only): ETag digests, the node's manifest, keep-alive GETs.

Shipped to nodes in front of s3.py's own source (``program_text("s3", args, lib=("s3lib",))``);
imported as a module only here, for tests.
"""

import hashlib
import http.client
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1 << 20
TIMEOUT = 30          # seconds a connect or a read may stall
MANIFESTS = "~/.clustertool/s3-manifests"


def _md5():
    try:
        return hashlib.md5(usedforsecurity=False)
    except TypeError:  # python < 3.9
        return hashlib.md5()


class Digest:
    """MD5 as S3 computes an ETag: of the whole (part == 0), or of the parts' MD5s (part > 0)."""

    def __init__(self, part):
        self.part, self.h, self.n, self.parts = part, _md5(), 0, []

    def update(self, data):
        if self.part <= 0:
            self.h.update(data)
            return
        view = memoryview(data)
        while view:
            take = view[: self.part - self.n]
            self.h.update(take)
            self.n += len(take)
            view = view[len(take):]
            if self.n == self.part:
                self.parts.append(self.h.digest())
                self.h, self.n = _md5(), 0

    def etag(self):
        if self.part <= 0:
            return self.h.hexdigest()
        parts = self.parts + ([self.h.digest()] if self.n else [])
        return f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}"


def hash_file(path, check):
    d = Digest(check)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            d.update(block)
    return d.etag()


class Manifest:
    """What this program put in DEST: rel -> [size, etag, mtime, how it was verified ("etag" or "size")];
    a journal line per object as it lands, folded into the JSON file at the end."""

    def __init__(self, dest):
        root = os.path.expanduser(MANIFESTS)
        os.makedirs(root, mode=0o700, exist_ok=True)
        base = os.path.join(root, hashlib.sha1(os.path.realpath(dest).encode()).hexdigest()[:20])
        self.path, self.journal, self.dest = base + ".json", base + ".journal", dest
        self.entries, self.lock = {}, threading.Lock()
        try:
            with open(self.path) as fh:
                self.entries = json.load(fh).get("objects", {})
        except (OSError, ValueError):
            pass
        try:
            with open(self.journal) as fh:
                for line in fh:
                    try:
                        rel, *entry = json.loads(line)
                        self.entries[rel] = entry
                    except ValueError:
                        pass  # a line cut short by a crash
        except OSError:
            pass

    def up_to_date(self, rel, size, etag, mtime):
        if self.entries.get(rel, [])[:3] != [size, etag, mtime]:
            return False
        try:
            st = os.stat(os.path.join(self.dest, rel))
        except OSError:
            return False
        return st.st_size == size and int(st.st_mtime) == mtime

    def hashable(self, rel):
        """Whether the file's ETag is a digest of its content (not so for SSE-KMS objects)."""
        return self.entries.get(rel, [None] * 4)[3:] == ["etag"]

    def record(self, rel, size, etag, mtime, verified):
        with self.lock:
            self.entries[rel] = [size, etag, mtime, verified]
            with open(self.journal, "a") as fh:
                fh.write(json.dumps([rel, size, etag, mtime, verified]) + "\n")

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"dest": self.dest, "objects": self.entries}, fh)
        os.replace(tmp, self.path)
        try:
            os.unlink(self.journal)
        except OSError:
            pass


class Http:
    """GETs over keep-alive connections (one per thread and endpoint); urllib where a proxy applies."""

    def __init__(self):
        self.local = threading.local()
        self.proxies = urllib.request.getproxies()

    def get(self, url, headers):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in self.proxies and not urllib.request.proxy_bypass(parts.hostname or ""):
            try:
                return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
            except urllib.error.HTTPError as exc:
                return exc
        conns = self.local.__dict__.setdefault("conns", {})
        key = (parts.scheme, parts.netloc)
        for attempt in (0, 1):
            conn = conns.get(key)
            reused = conn is not None
            if conn is None:
                kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
                conn = conns[key] = kind(parts.netloc, timeout=TIMEOUT)
            try:
                conn.request("GET", parts.path + ("?" + parts.query if parts.query else ""), headers=headers)
                return conn.getresponse()
            except (OSError, http.client.HTTPException):
                self.drop(url)
                if attempt or not reused:  # a reused connection may have been closed by the server: once more
                    raise
        raise AssertionError("unreachable")

    def drop(self, url):
        parts = urllib.parse.urlsplit(url)
        conn = self.local.__dict__.get("conns", {}).pop((parts.scheme, parts.netloc), None)
        if conn is not None:
            conn.close()


def status_of(resp):
    return getattr(resp, "status", None) or resp.code


def s3_error(resp):
    """(Code, Message) of an S3 error response."""
    body = resp.read(65536).decode("utf-8", "replace")

    def tag(name):
        return body.split(f"<{name}>", 1)[1].split(f"</{name}>", 1)[0] if f"<{name}>" in body else ""

    return tag("Code") or getattr(resp, "reason", "") or "", tag("Message")


def is_expired(code, message):
    return code == "ExpiredToken" or (code == "AccessDenied" and "expired" in message.lower())


def where(url):
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def why(exc):
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def partial_name(rel, etag):
    """Where an object's download grows (beside its target; the name changes with its ETag)."""
    tag = hashlib.sha1(f"{rel}\0{etag}".encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(rel), f".ct-{tag}.part")


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
