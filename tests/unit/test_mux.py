"""Sessions over a ControlMaster's socket (remote/mux.py): the messages, the socket path, and the
client against a stand-in master speaking OpenSSH's PROTOCOL.mux (the real master: tests/local)."""

from __future__ import annotations

import array
import os
import shutil
import socket
import struct
import subprocess
import threading

import pytest

from clustertool.remote import mux

pytestmark = pytest.mark.unit


def test_messages_are_length_prefixed_u32s_and_strings():
    assert mux.hello() == struct.pack(">III", 8, mux.MUX_MSG_HELLO, 4)
    body = mux.new_session(7, "echo 'hi'")[4:]
    fields = struct.unpack(">IIIIIIIII", body[:36])
    assert fields[:3] == (mux.MUX_C_NEW_SESSION, 7, 0)  # type, request id, empty reserved string
    assert fields[3:7] == (0, 0, 0, 0) and fields[7] == mux.NO_ESCAPE  # no tty/X11/agent/subsystem
    assert fields[8] == 0 and body[36:] == struct.pack(">I", 9) + b"echo 'hi'"  # empty TERM, the command


def test_the_socket_path_is_the_one_ssh_computes_for_percent_C(tmp_path):
    if not shutil.which("ssh"):
        pytest.skip("no ssh client")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host n1\n  HostName 10.213.4.7\n  Port 2222\n  User alice\n  ControlPath {tmp_path}/%C\n")
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), "n1"], capture_output=True, text=True, check=True).stdout
    want = next(line.split(None, 1)[1] for line in out.splitlines() if line.startswith("controlpath "))
    assert str(mux.control_path(tmp_path, "10.213.4.7", 2222, "alice")) == want


class Master(threading.Thread):
    """A stand-in master: answers hello, takes a session and its three descriptors, writes the
    command's "output" to the passed stdout, then says how it exited (or not)."""

    def __init__(self, path, reply="exit", code=3):
        super().__init__(daemon=True)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(1)
        self.reply, self.code, self.command, self.stdin_data = reply, code, None, None

    def run(self):
        conn, _ = self.srv.accept()
        kind, _, _ = mux.parse(mux.read_packet(conn))
        assert kind == mux.MUX_MSG_HELLO
        conn.sendall(mux.hello())
        body = mux.read_packet(conn)
        self.command = body[40:].decode()
        fds = []
        for _ in range(3):
            _, anc, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(4))
            fds.append(array.array("i", anc[0][2][:4])[0])
        if self.reply == "deny":
            conn.sendall(mux.packet(mux.MUX_S_PERMISSION_DENIED, 1, b"not today"))
        else:
            conn.sendall(mux.packet(mux.MUX_S_SESSION_OPENED, 1, 42))
            with os.fdopen(fds[0], "rb") as stdin:
                self.stdin_data = stdin.read()
            os.write(fds[1], b"out " + self.command.encode() + b"\n")
            os.write(fds[2], b"err\n")
            if self.reply == "exit":
                conn.sendall(mux.packet(mux.MUX_S_EXIT_MESSAGE, 42, self.code))
        for fd in fds[1:]:
            os.close(fd)
        conn.close()


def test_a_session_runs_the_command_with_stdin_and_returns_output_and_exit_code(tmp_path):
    master = Master(tmp_path / "m", code=3)
    master.start()
    s = mux.MuxSession(tmp_path / "m", "hostname", with_stdin=True)
    s.stdin.write(b"data on stdin")
    s.stdin.close()
    assert s.stdout.read() == b"out hostname\n" and s.stderr.read() == b"err\n"
    assert s.wait(5) == 3 and s.poll() == 3 and master.stdin_data == b"data on stdin"


def test_a_session_that_ends_without_an_exit_status_is_255_as_with_ssh(tmp_path):
    Master(tmp_path / "m", reply="vanish").start()
    s = mux.MuxSession(tmp_path / "m", "true", with_stdin=False)
    s.stdout.read()
    assert s.wait(5) == 255


def test_a_refused_session_or_no_master_is_a_mux_error_so_ssh_is_used_instead(tmp_path):
    Master(tmp_path / "m", reply="deny").start()
    with pytest.raises(mux.MuxError, match="not today"):
        mux.MuxSession(tmp_path / "m", "true", with_stdin=False)
    with pytest.raises(mux.MuxError, match="no master"):
        mux.MuxSession(tmp_path / "absent", "true", with_stdin=False)
    assert mux.terminate(tmp_path / "absent") is False
