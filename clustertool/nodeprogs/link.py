"""The links of the copy relay (stdlib only): dialing the next hop ahead, handing the link over,
carrying stderr back up the chain; and ``prepare``, which sets a node's stations up.

Part of the node programs ``relay`` (stream.py, extract.py, link.py, relay.py) and ``survey``
(stream.py, link.py, manifest.py: the copy's first round, which prepares a node's stations
and then lists DEST), each sent as one file; importable here too.

* prepare (ARGS ``prepare``: the stations of this node): stores each hop's relay in its status
  folder and forks its dialer; removes station folders an interrupted copy left a day ago.
* the dialer (forked by prepare, ahead of the stream): opens the ssh session to the next hop,
  which starts that hop's relay, and hands the session's stdin and stderr to this node's relay
  over a unix socket (SCM_RIGHTS).  So every link of the chain connects at once, in parallel,
  while the copy is still planning, instead of one after another while the data waits.
"""

import array
import errno
import os
import socket
import subprocess
import threading
import time

PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031
CONNECT_TIMEOUT = 60.0
ACCEPT_TIMEOUT = 180.0
STALE_S = 86400


def widen_pipe(fd):
    try:
        import fcntl
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, ImportError):
        pass  # not a pipe, or not allowed: the default size works, with more wake-ups


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Forward:
    """The stream's way to the next hop: a pipe into ssh, and ssh's stderr to relay upstream."""

    def __init__(self, data_fd, err_fd, sock=None, proc=None):
        self.fd, self.sock, self.proc, self.error = data_fd, sock, proc, None
        self.copier = threading.Thread(target=_copy_lines, args=(err_fd,), daemon=True)
        self.copier.start()

    def send(self, data):
        if self.fd is None:
            return
        try:
            write_all(self.fd, data)
        except OSError as exc:  # the next hop is gone: keep writing here, say so
            self.error = f"next hop: {exc.strerror or exc}"
            self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def wait(self):
        """The next hop's exit code (after it finished: the chain ends downstream first)."""
        self.close()
        self.copier.join(ACCEPT_TIMEOUT)
        if self.proc is not None:
            return self.proc.wait()
        try:
            self.sock.settimeout(None)
            reply = self.sock.makefile("rb").readline().strip()
            return int(reply) if reply else 255
        except (OSError, ValueError):
            return 255


_ERR = threading.Lock()


def say(text):
    """A whole line on stderr (which flows back up the chain); never fails the relay."""
    with _ERR:
        try:
            write_all(2, text)
        except OSError:
            pass  # upstream is gone: nobody to tell


def _copy_lines(fd):
    """Downstream stderr (progress lines of later hops, ssh's errors) onto ours, line by line."""
    with os.fdopen(fd, "rb", buffering=0) as stream:
        pending = b""
        while True:
            block = stream.read(65536)
            if not block:
                break
            pending += block
            *lines, pending = pending.split(b"\n")
            for ln in lines:
                say(ln + b"\n")
        if pending:
            say(pending + b"\n")


def spawn_forward(argv):
    """Start ssh to the next hop here; its stdin is a fresh (widened) pipe."""
    r, w = os.pipe()
    er, ew = os.pipe()
    widen_pipe(w)
    proc = subprocess.Popen(argv, stdin=r, stdout=subprocess.DEVNULL, stderr=ew, close_fds=True)
    os.close(r)
    os.close(ew)
    return proc, w, er


def connect_forward(sdir):
    """This hop's dialer hands over the next hop's stdin and stderr (it may start after us)."""
    path, deadline = os.path.join(sdir, "fwd.sock"), time.monotonic() + CONNECT_TIMEOUT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            break
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(fds) != 2:
        raise OSError(errno.EPROTO, "the dialer sent no descriptors")
    return Forward(fds[0], fds[1], sock=sock)


def dial(station):
    """Open the session to the next hop now; hand it to this node's relay when it asks."""
    sdir = station["sdir"]
    record_pgid(sdir, "pgid.dial")
    proc, w, er = spawn_forward(station["forward"])
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(os.path.join(sdir, "fwd.sock"))
    srv.listen(1)
    srv.settimeout(ACCEPT_TIMEOUT)
    conn = None
    try:
        conn, _ = srv.accept()
        conn.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w, er]))])
    except OSError:
        pass  # nobody came (the copy stopped early): closing ends the next hop too
    finally:
        os.close(w)
        os.close(er)
    rc = proc.wait()
    if conn is not None:
        try:
            conn.sendall(f"{rc}\n".encode())
        except OSError:
            pass
        conn.close()


def start_dialer(station):
    """Fork the dialer (no second interpreter to start): its own session, its output in dial.log."""
    if os.fork():
        return
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(station["sdir"], "dial.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for fd in (0, 1, 2):
            os.dup2(log if fd else null, fd)
        os.closerange(3, 1 << 16)
        dial(station)
    finally:
        os._exit(0)


def record_pgid(sdir, name):
    if sdir:
        with open(os.path.join(sdir, name), "w") as fh:
            fh.write(f"{os.getpgrp()}\n")


def remove_dir(sdir):
    import shutil
    shutil.rmtree(sdir, ignore_errors=True)


def prepare(args):
    """Store each station's relay (a hop's is started by the previous hop's dialer) and fork
    its dialer; remove station folders an interrupted copy left more than a day ago."""
    try:
        for name in os.listdir(".cache/clustertool"):
            path = os.path.join(".cache/clustertool", name)
            if name.startswith("copy-") and time.time() - os.lstat(path).st_mtime > STALE_S:
                remove_dir(path)
    except OSError:
        pass
    for station in args["prepare"]:
        sdir = station["sdir"]
        remove_dir(sdir)
        os.makedirs(sdir)
        if station.get("program"):
            with open(os.path.join(sdir, "relay.py"), "w") as fh:
                fh.write(station["program"])
        if station.get("forward"):
            start_dialer(station)
    return 0


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "prepare" in ARGS:  # noqa: F821 (prepended)
    prepare(ARGS)  # noqa: F821  (in a survey, manifest.py follows and lists DEST)
