"""A loopback HTTP proxy in front of the moto server that fails the way real endpoints and real
processes do, for clustertool running as its own process (tests/aws/test_fault_matrix.py).

Every request passes through to moto unless a rule matches its AWS action (``Action=`` of the
query protocols, ``X-Amz-Target`` of the JSON ones, ``efs:<Action>`` for EFS's REST paths) and occurrence:

- ``signal``: after moto answered the n-th call, send a signal to ``proxy.pid`` (the clustertool
  process), hold the answer until that process is gone (at most ``hold`` s), then deliver it;
- ``delay``: wait before passing the call on;
- ``hang``: accept the call and never answer (until the proxy closes);
- ``held``: hold the call until the test calls ``rule.release()`` (or the proxy closes), then pass
  it on: the test, not a delay, decides how long the process under test stays inside that call;
- ``reset``: after the call, empty moto (``/moto-api/reset``: what a restarted server holds);
- ``error``: answer with that EC2 error code instead of passing the call on (moto never runs out
  of capacity: this is how a process under test meets InsufficientInstanceCapacity);
  ``times``: how many calls in a row from the n-th get the effect (default 1).

``hang_all()`` makes every call hang; ``refuse()`` closes the listening socket, so connections
are refused.  ``calls`` lists the actions seen, in order.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


@dataclass
class Rule:
    action: str
    nth: int = 1
    signal: int | None = None
    delay: float = 0.0
    hang: bool = False
    reset: bool = False
    hold: float = 0.3
    error: str = ""
    times: int = 1
    held: bool = False
    seen: int = 0
    hits: int = 0
    fired: bool = False
    gate: threading.Event = field(default_factory=threading.Event, repr=False)

    def release(self) -> None:
        """Let a ``held`` call (and any later one this rule holds) pass on to moto."""
        self.gate.set()


EFS_REST = {("POST", "file-systems"): "CreateFileSystem", ("GET", "file-systems"): "DescribeFileSystems",
            ("DELETE", "file-systems"): "DeleteFileSystem", ("POST", "mount-targets"): "CreateMountTarget",
            ("GET", "mount-targets"): "DescribeMountTargets", ("DELETE", "mount-targets"): "DeleteMountTarget",
            ("POST", "resource-tags"): "TagResource", ("DELETE", "resource-tags"): "UntagResource"}


def action_of(headers, body: bytes, method: str = "POST", path: str = "/") -> str:
    target = headers.get("X-Amz-Target")
    if target:
        return target.rsplit(".", 1)[-1]
    parts = urllib.parse.urlsplit(path).path.strip("/").split("/")
    if parts[0] == "2015-02-01" and len(parts) > 1:  # EFS's REST API: named efs:<Action>
        return "efs:" + EFS_REST.get((method, parts[1]), f"{method} {'/'.join(parts[1:])}")
    fields = urllib.parse.parse_qs(body.decode(errors="replace"))
    return (fields.get("Action") or ["?"])[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


class FaultProxy:
    def __init__(self, target: str):
        self.target = urllib.parse.urlsplit(target)
        self.rules: list[Rule] = []
        self.calls: list[str] = []
        self.pid: int | None = None
        self.signalled: list[tuple[str, int]] = []
        self._hang_all = False
        self._release = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                proxy._handle(self)

            do_GET = do_POST  # noqa: N815
            do_DELETE = do_POST  # noqa: N815 - EFS's REST API deletes with DELETE

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def on(self, action: str, nth: int = 1, **effect) -> Rule:
        rule = Rule(action, nth, **effect)
        self.rules.append(rule)
        return rule

    def hang_all(self) -> None:
        self._hang_all = True

    def refuse(self) -> None:
        """Stop listening: from now on connections to the port are refused."""
        self.server.shutdown()
        self.server.server_close()

    def close(self) -> None:
        self._release.set()
        for rule in self.rules:
            rule.release()
        try:
            self.refuse()
        except OSError:
            pass

    # ---- one request ----------------------------------------------------------------------

    def _match(self, action: str) -> Rule | None:
        with self._lock:
            self.calls.append(action)
            for rule in self.rules:
                if rule.action == action and not rule.fired:
                    rule.seen += 1
                    if rule.seen >= rule.nth:
                        rule.hits += 1
                        rule.fired = rule.hits >= rule.times
                        return rule
        return None

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        action = action_of(handler.headers, body, handler.command, handler.path)
        rule = self._match(action)
        if self._hang_all or (rule and rule.hang):
            self._release.wait(600)
            return
        if rule and rule.held:
            rule.gate.wait(600)
        if rule and rule.delay:
            time.sleep(rule.delay)
        if rule and rule.error:
            status, headers, payload = 400, [("Content-Type", "text/xml")], ec2_error(rule.error)
        else:
            status, headers, payload = self._forward(handler, body)
        if rule and rule.reset:
            request = urllib.request.Request(self._base() + "/moto-api/reset", method="POST")
            urllib.request.urlopen(request, timeout=10).read()
        if rule and rule.signal is not None and self.pid:
            self.signalled.append((action, rule.signal))
            os.kill(self.pid, rule.signal)
            deadline = time.monotonic() + rule.hold
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        try:
            handler.send_response(status)
            for key, value in headers:
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client is gone (killed): nothing to answer

    def _base(self) -> str:
        return f"{self.target.scheme}://{self.target.netloc}"

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes):
        conn = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP}
            conn.request(handler.command, handler.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP]
            return response.status, kept, payload
        finally:
            conn.close()


def ec2_error(code: str) -> bytes:
    """An EC2 (query protocol) error response with ``code``, as botocore parses it."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>injected by the test's proxy: {code}</Message></Error></Errors>"
            "<RequestID>faultproxy</RequestID></Response>").encode()


def refusing_url() -> str:
    """An address where nothing listens: every connection is refused."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
