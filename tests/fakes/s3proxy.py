"""An HTTP proxy in front of a moto S3 server that does what moto does not, for sync-s3's tests.

moto serves presigned URLs but checks neither their signature nor their expiry.  This proxy
forwards every request to moto unchanged and, for GETs of presigned URLs (``X-Amz-Expires`` in
the query), answers as S3 would where the test asks it to:

* **expiry, for real**: a URL whose ``X-Amz-Date`` + ``X-Amz-Expires`` is past gets S3's
  ``403 AccessDenied: Request has expired``; ``always_expired`` keys get it every time (a clock
  that disagrees with the signer's);
* ``denied`` keys: ``403 AccessDenied: Access Denied`` (a bucket policy that refuses them);
* ``delete_on_get`` keys: the proxy deletes the object in moto (boto3) before forwarding the first
  GET, so moto itself answers ``404 NoSuchKey`` (an object deleted between listing and download);
* ``cut_once`` keys: the first GET's body stops halfway and the connection closes (a dropped
  transfer, to be resumed by Range);
* ``rate``: bytes per second per response body (a slow link, so URLs can expire mid-run).

It records every presigned GET (client address, key, status).  Listening address and port are
the test's choice: on a local cluster's bridge, nodes reach it like any S3 endpoint.
"""

from __future__ import annotations

import calendar
import http.client
import http.server
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

EXPIRED = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>"
           "<Message>Request has expired</Message></Error>")
DENIED = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>"
          "<Message>Access Denied</Message></Error>")


@dataclass
class Rules:
    denied: set[str] = field(default_factory=set)
    always_expired: set[str] = field(default_factory=set)
    delete_on_get: set[str] = field(default_factory=set)
    cut_once: set[str] = field(default_factory=set)
    ranges: list[tuple[str, str | None]] = field(default_factory=list)  # (key, Range header) of presigned GETs
    rate: float | None = None           # bytes per second per response
    gets: list[tuple[str, str, int]] = field(default_factory=list)  # (client, key, status)


def signed_until(query: dict[str, list[str]]) -> float | None:
    """When a presigned URL expires (epoch seconds), from its X-Amz-Date and X-Amz-Expires."""
    if "X-Amz-Expires" not in query or "X-Amz-Date" not in query:
        return None
    signed = calendar.timegm(time.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ"))
    return signed + int(query["X-Amz-Expires"][0])


class S3Proxy:
    def __init__(self, host: str, upstream: str, client=None, port: int = 0):
        self.upstream = urllib.parse.urlsplit(upstream).netloc
        self.rules = Rules()
        self.client = client          # boto3 S3 client for delete_on_get
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.handle(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- one request ---------------------------------------------------------------------
    def handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        parts = urllib.parse.urlsplit(req.path)
        query = urllib.parse.parse_qs(parts.query)
        bucket, _, key = urllib.parse.unquote(parts.path).lstrip("/").partition("/")
        until = signed_until(query) if req.command == "GET" else None
        if until is not None:
            status = self._refusal(req, bucket, key, until)
            with self._lock:
                self.rules.gets.append((req.client_address[0], key, status or 0))
                self.rules.ranges.append((key, req.headers.get("Range")))
                cut = not status and key in self.rules.cut_once
                self.rules.cut_once.discard(key)
            if status:
                return
            self._forward(req, cut)
            return
        self._forward(req)

    def _refusal(self, req, bucket: str, key: str, until: float) -> int | None:
        rules = self.rules
        if key in rules.always_expired or time.time() > until:
            return self._answer(req, 403, EXPIRED)
        if key in rules.denied:
            return self._answer(req, 403, DENIED)
        with self._lock:  # held through the deletion: no GET of that key overtakes it
            if key in rules.delete_on_get:
                self.client.delete_object(Bucket=bucket, Key=key)
                rules.delete_on_get.discard(key)
        return None

    @staticmethod
    def _answer(req, status: int, body: str) -> int:
        data = body.encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/xml")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)
        return status

    def _forward(self, req, cut: bool = False) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        headers = {k: v for k, v in req.headers.items() if k.lower() not in ("connection", "keep-alive")}
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            conn.request(req.command, req.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            req.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "server",
                                     "date"):
                    req.send_header(k, v)
            length = resp.getheader("Content-Length") if req.command == "HEAD" else None
            req.send_header("Content-Length", length or str(len(data)))
            req.end_headers()
            if cut:
                req.wfile.write(data[: len(data) // 2])
                req.wfile.flush()
                req.close_connection = True
            elif req.command != "HEAD":
                self._send_body(req, data)
        finally:
            conn.close()

    def _send_body(self, req, data: bytes) -> None:
        rate = self.rules.rate
        if not rate:
            req.wfile.write(data)
            return
        step = max(1024, int(rate / 20))
        for at in range(0, len(data), step):
            req.wfile.write(data[at:at + step])
            time.sleep(step / rate)
