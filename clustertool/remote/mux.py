"""Sessions over a running OpenSSH ControlMaster, without starting an ssh process per node.

A repeated command reuses one authenticated connection per node (ControlMaster): ``ssh`` then
only connects to the master's unix socket, asks it for a session and hands over its stdin,
stdout and stderr.  Starting that ssh process (exec, libcrypto, config) is most of the cost of
a warm call, times the number of nodes.  This module speaks the same small protocol itself
(OpenSSH's PROTOCOL.mux: a hello, MUX_C_NEW_SESSION with the three descriptors passed over the
socket, then MUX_S_EXIT_MESSAGE), so a warm fan-out to 254 nodes starts no process here.

Where no master runs (a cold call), or anything about the socket is unexpected, the caller
falls back to spawning ssh, which also starts the master.  Exit codes match ssh's: the
command's, or 255 when the connection ended without one.
"""

from __future__ import annotations

import array
import hashlib
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_C_TERMINATE = 0x10000005
MUX_S_OK = 0x80000001
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
PROTOCOL_VERSION = 4
NO_ESCAPE = 0xFFFFFFFF
CONNECT_TIMEOUT = 5.0


class MuxError(Exception):
    """The master is not there or said no: use a real ssh instead."""


def control_path(control_dir: Path, host: str, port: int, user: str, local_host: str | None = None) -> Path:
    """ssh's ``%C`` ControlPath token: SHA-1 of local host name, remote host, port and user."""
    local = socket.gethostname() if local_host is None else local_host
    return control_dir / hashlib.sha1(f"{local}{host}{port}{user}".encode()).hexdigest()


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def packet(*fields: int | bytes) -> bytes:
    """One mux message: u32 length, then u32 integers and length-prefixed strings."""
    body = b"".join(struct.pack(">I", f) if isinstance(f, int) else _string(f) for f in fields)
    return struct.pack(">I", len(body)) + body


def hello() -> bytes:
    return packet(MUX_MSG_HELLO, PROTOCOL_VERSION)


def new_session(request_id: int, command: str) -> bytes:
    """MUX_C_NEW_SESSION: no tty, no X11, no agent, not a subsystem, no escape character."""
    return packet(MUX_C_NEW_SESSION, request_id, b"", 0, 0, 0, 0, NO_ESCAPE, b"", command.encode())


def parse(body: bytes) -> tuple[int, list[int], bytes]:
    """(type, the u32 fields that follow, the rest) of a message from the master."""
    kind = struct.unpack(">I", body[:4])[0]
    fixed = {MUX_MSG_HELLO: 1, MUX_S_SESSION_OPENED: 2, MUX_S_EXIT_MESSAGE: 2, MUX_S_OK: 1,
             MUX_S_TTY_ALLOC_FAIL: 1, MUX_S_FAILURE: 1, MUX_S_PERMISSION_DENIED: 1}.get(kind, 0)
    ints = list(struct.unpack(f">{fixed}I", body[4:4 + 4 * fixed])) if fixed else []
    return kind, ints, body[4 + 4 * fixed:]


def _reason(rest: bytes) -> str:
    if len(rest) >= 4:
        n = struct.unpack(">I", rest[:4])[0]
        return rest[4:4 + n].decode("utf-8", "replace")
    return ""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the master closed the connection")
        data += chunk
    return data


def read_packet(sock: socket.socket) -> bytes:
    size = struct.unpack(">I", _recv_exact(sock, 4))[0]
    if size > 256 * 1024:
        raise MuxError("oversized message from the master")
    return _recv_exact(sock, size)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(str(path))
        sock.sendall(hello())
        kind, _, _ = parse(read_packet(sock))
    except (OSError, EOFError, struct.error) as exc:
        sock.close()
        raise MuxError(f"no master at {path}: {exc}") from None
    if kind != MUX_MSG_HELLO:
        sock.close()
        raise MuxError("the master did not say hello")
    return sock


def _send_fd(sock: socket.socket, fd: int) -> None:
    sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


class MuxSession:
    """One command in a session of a running master; quacks like the Popen run_on_nodes uses
    (``stdin``, ``stdout``, ``stderr``, ``wait``, ``poll``, ``returncode``, ``kill``)."""

    pid = None

    def __init__(self, path: Path, command: str, with_stdin: bool):
        sock = _connect(path)
        ours, theirs = [], []
        try:
            if with_stdin:
                r, w = os.pipe()
                theirs.append(r)
                ours.append(w)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY))
            for _ in range(2):
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            sock.sendall(new_session(1, command))
            for fd in theirs:
                _send_fd(sock, fd)
            kind, ints, rest = parse(read_packet(sock))
        except (OSError, EOFError, struct.error) as exc:
            for fd in ours:
                os.close(fd)
            sock.close()
            raise MuxError(f"session request failed: {exc}") from None
        finally:
            for fd in theirs:
                os.close(fd)
        if kind != MUX_S_SESSION_OPENED:
            for fd in ours:
                os.close(fd)
            sock.close()
            raise MuxError(f"the master refused the session: {_reason(rest) or hex(kind)}")
        self.session_id = ints[1]
        self.stdin = os.fdopen(ours.pop(0), "wb") if with_stdin else None
        self.stdout, self.stderr = os.fdopen(ours[0], "rb"), os.fdopen(ours[1], "rb")
        self.returncode: int | None = None
        self._sock = sock
        self._done = threading.Event()
        threading.Thread(target=self._await_exit, daemon=True).start()

    def _await_exit(self) -> None:
        code = 255  # as ssh: the connection ended without an exit status
        self._sock.settimeout(None)
        try:
            while True:
                kind, ints, _ = parse(read_packet(self._sock))
                if kind == MUX_S_EXIT_MESSAGE and ints[0] == self.session_id:
                    code = ints[1]
        except (OSError, EOFError, struct.error, MuxError):
            pass  # the master closes the socket after the session (or died)
        finally:
            self._sock.close()
            self.returncode = code
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            assert timeout is not None  # wait(None) returns only once done
            raise subprocess.TimeoutExpired("mux session", timeout)
        assert self.returncode is not None  # set before _done
        return self.returncode

    def kill(self) -> None:
        """End the session: the master closes its channel when our control connection goes."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def terminate(path: Path) -> bool:
    """Ask a master to exit (``ssh -O exit`` without the process); False if none answered."""
    try:
        sock = _connect(path)
    except MuxError:
        return False
    try:
        sock.sendall(packet(MUX_C_TERMINATE, 1))
        kind, _, _ = parse(read_packet(sock))
        return kind == MUX_S_OK
    except (OSError, EOFError, struct.error, MuxError):
        return False
    finally:
        sock.close()
