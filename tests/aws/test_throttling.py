"""Throttling is retried with backoff by botocore's retry config, below the seam: a loopback
proxy in front of the moto server answers the first DescribeInstanceTypes call with EC2's
RequestLimitExceeded (HTTP 503), as AWS does under load, then passes requests through."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
THROTTLED = (b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code>'
             b'<Message>Request limit exceeded.</Message></Error></Errors><RequestID>t-1</RequestID></Response>')


def _proxy(target: str, throttle: int):
    seen = {"throttled": 0, "passed": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if b"Action=DescribeInstanceTypes" in body and seen["throttled"] < throttle:
                seen["throttled"] += 1
                return self._send(503, THROTTLED, "text/xml")
            seen["passed"] += 1
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            request = urllib.request.Request(target + self.path, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    self._send(response.status, response.read(), response.headers.get("Content-Type", "text/xml"))
            except urllib.error.HTTPError as exc:
                self._send(exc.code, exc.read(), exc.headers.get("Content-Type", "text/xml"))

        def _send(self, status, payload, ctype):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_throttled_calls_are_retried_with_backoff_and_succeed(aws, monkeypatch):
    server, seen = _proxy(aws.url, throttle=1)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("CLUSTERTOOL_AWS_MAX_ATTEMPTS", "4")
        code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge",
                                "--name", unique("thr"), "--dry-run")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err
    assert seen["throttled"] == 1 and seen["passed"] > 0
    assert "would succeed" in out
