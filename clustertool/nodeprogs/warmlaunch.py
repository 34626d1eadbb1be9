"""A warm node launcher: one Python per node that has already imported a launcher (torchrun, accelerate,
deepspeed), and forks a copy of itself for each job's start (stdlib only; never imports clustertool).

torchrun's own start is most of a job's start on a node: its ``import torch`` (about a second of CPU) before it
does anything.  The job agent (jobagent.py) starts one of these after a node launcher's first start on a node,
at the lowest CPU priority there is (SCHED_IDLE, so it takes no CPU the job wants), and from then on asks it,
over a Unix socket in ``~/.clustertool/warm/``, for the launcher: the copy forked here is that launcher, with
the job's command line, environment, working folder and standard files, and nothing left of this one.  It runs
the launcher's own script (its console script: ``from torch.distributed.run import main`` ...), whose imports
are already done.

    python warmlaunch.py KEY SCRIPT SOCKET PAD     (the interpreter named by SCRIPT's #! line)

* KEY names this warm launcher: its interpreter, its script, the variables read while importing (what the
  agent keeps of the job's environment in this process's), and this file's text.  A job whose KEY differs
  gets another one; one lock per KEY (``SOCKET.lock``), so never two.
* The socket appears once the imports are done (bound beside, then renamed), 0600, in a 0700 folder; only
  this user's processes are served (SO_PEERCRED).
* A request: one JSON line (argv, env, cwd, job) with the job's stdin, stdout and stderr (SCM_RIGHTS).
  Answers: ``{"pid": N}`` (the launcher, in a process group of its own), later ``{"status": S}`` (as
  Popen.returncode says it), or ``{"cold": why}`` (the launcher's files changed since the import: this one
  ends, the agent starts the launcher itself).
* The launcher's /proc entries say what a launcher started by hand says: its environment (what `kill`,
  `doctor` and the watch find a job's processes by) is written over this process's (the PAD argument and a
  padding variable reserve the room), its command line and name too.
* The agent gone (the connection closed) before its launcher ended: SIGTERM to the launcher's group, SIGKILL 3 s
  later, as the agent's own death did to a launcher it started (PR_SET_PDEATHSIG).  This one gone: the
  launchers get SIGTERM (their PR_SET_PDEATHSIG).
* It ends when idle ``CLUSTERTOOL_WARM_IDLE_S`` (3600) with nothing running, when its socket is removed, or on
  SIGTERM.
"""

import array
import json
import os
import re
import selectors
import signal
import socket
import sys
import time

IDLE_S = float(os.environ.get("CLUSTERTOOL_WARM_IDLE_S") or 3600)
GRACE_S = 3.0
MAX_SCRIPT = 4096  # a console script is a few lines; anything bigger is not one


def imports_of(script):
    """The modules a console script imports at its top (``from X import Y``, ``import X``)."""
    with open(script, "rb") as fh:
        text = fh.read(MAX_SCRIPT + 1).decode("utf-8", "replace")
    if len(text) > MAX_SCRIPT:
        return []
    found = re.findall(r"^from\s+([\w.]+)\s+import\s", text, re.M) + re.findall(r"^import\s+([\w.]+)\s*$", text, re.M)
    return [m for m in dict.fromkeys(found) if m not in ("sys", "re", "os")]


def stamp(path):
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def proc_areas():
    """(arg_start, arg_end, env_start, env_end) of this process, from /proc/self/stat (fields 48-51)."""
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return tuple(int(x) for x in fields[45:49])


def fill_area(start, end, records):
    """Write NUL-ended ``records`` over [start, end) of this process's memory, as many as fit, the rest one
    padding record (or NULs)."""
    import ctypes

    size = end - start
    out = b""
    for rec in records:
        piece = rec.encode("utf-8", "replace").replace(b"\0", b"") + b"\0"
        if len(out) + len(piece) > size:
            break
        out += piece
    left = size - len(out)
    out += (b"_=" + b"." * (left - 3) + b"\0") if left >= 3 else b"\0" * left
    ctypes.memmove(start, out, size)


def set_name(name):
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def nice_limit():
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NICE)[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return 0


def idle_allowed(euid, rlimit_nice):
    """Whether SCHED_IDLE may be left again for SCHED_OTHER at nice 0 (sched(7)): root, or an RLIMIT_NICE of 20
    or more (unlimited: -1).  Where not, the imports run at the normal priority: a warm launcher that cannot come
    back would hand SCHED_IDLE to every launcher it forks."""
    return euid == 0 or rlimit_nice < 0 or rlimit_nice >= 20


def die_with_parent(sig):
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    def __init__(self, script, path, lock):
        self.script, self.path, self.lock = os.path.abspath(script), path, lock
        self.modules = imports_of(self.script)
        self.stamps = {}
        self.areas = (0, 0, 0, 0)  # /proc/self/stat's arg_start, arg_end, env_start, env_end once warm
        self.running = {}  # pidfd -> (pid, connection)
        self.kills = {}  # pid -> when its group gets SIGKILL (its agent gone)
        self.last = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # bound by listen()

    def warm(self):
        """Import the script's modules at the lowest priority, then come back to the normal one (the launchers
        forked later must not inherit SCHED_IDLE); where that way back is not allowed, import at the normal one."""
        idle = False
        if hasattr(os, "SCHED_IDLE") and idle_allowed(os.geteuid(), nice_limit()):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                idle = True
            except OSError:
                pass
        sys.path[0] = os.path.dirname(self.script)
        import importlib

        for name in self.modules:
            mod = importlib.import_module(name)
            if getattr(mod, "__file__", None):
                self.stamps[mod.__file__] = stamp(mod.__file__)
        self.stamps[self.script] = stamp(self.script)
        if idle:
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                return False
        self.areas = proc_areas()
        return True

    def stale(self):
        for path, was in self.stamps.items():
            try:
                if stamp(path) != was:
                    return path
            except OSError:
                return path
        return None

    def listen(self):
        tmp = f"{self.path}.{os.getpid()}"
        sock = self.listener
        old = os.umask(0o177)
        try:
            os.chdir(os.path.dirname(self.path))
            sock.bind(os.path.basename(tmp))  # a socket's path has 107 bytes at most: a long home's would not fit
        finally:
            os.umask(old)
        sock.listen(64)
        os.replace(tmp, self.path)
        self.sock_stamp = stamp(self.path)
        self.sel.register(sock, selectors.EVENT_READ, ("accept", None))

    def serve(self):
        while True:
            soon = min(self.kills.values(), default=time.monotonic() + 5.0)
            events = self.sel.select(timeout=max(0.0, min(5.0, soon - time.monotonic())))
            self.kill_late()
            for sk, _ in events:
                kind, data = sk.data
                if kind == "accept":
                    self.accept()
                elif kind == "exit":
                    self.reap(sk.fileobj)
                elif kind == "conn":
                    self.hangup(sk.fileobj, data)
            try:
                if stamp(self.path) != self.sock_stamp:
                    return "socket replaced"
            except OSError:
                return "socket removed"
            if not self.running and time.monotonic() - self.last > IDLE_S:
                return "idle"

    def accept(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.last = time.monotonic()
        try:
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
                conn.close()
                return
            conn.settimeout(10.0)
            request, fds = receive(conn)
            conn.settimeout(None)
        except (OSError, ValueError):
            conn.close()
            return
        changed = self.stale()
        if changed:  # gone before the agent hears it: the agent starts the next one
            self.close()
            os.close(self.lock)
            try:
                send(conn, {"cold": f"{changed} changed since this warm launcher started"})
            except OSError:
                pass
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            self.child(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.running[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", None))
        self.sel.register(conn, selectors.EVENT_READ, ("conn", pid))
        send(conn, {"pid": pid})

    def reap(self, pidfd):
        pid, conn = self.running.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            send(conn, {"status": code})
        except OSError:
            pass
        conn.close()
        self.last = time.monotonic()

    def hangup(self, conn, pid):
        """The agent's end closed while its launcher runs: the agent is gone; stop the launcher as its death
        would have."""
        try:
            if conn.recv(1, socket.MSG_PEEK):
                conn.recv(4096)  # nothing is expected; drop it
                return
        except OSError:
            pass
        self.sel.unregister(conn)
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            return
        self.kills[pid] = time.monotonic() + GRACE_S  # SIGKILL then, to what is left of its group

    def kill_late(self):
        now = time.monotonic()
        for pid, when in list(self.kills.items()):
            if when <= now:
                del self.kills[pid]
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass

    def child(self, request, fds):
        """In the fork: become the launcher."""
        code = 1
        try:
            os.setpgid(0, 0)
            die_with_parent(signal.SIGTERM)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            os.chdir(request["cwd"])
            env = request["env"]
            os.environ.clear()
            os.environ.update(env)
            argv = request["argv"]
            arg_start, arg_end, env_start, env_end = self.areas
            # the job's markers first: where the room runs out, what is left out is the least looked for
            ours = [f"{k}={v}" for k, v in env.items() if k.startswith("CLUSTERTOOL_")]
            rest = [f"{k}={v}" for k, v in env.items() if not k.startswith("CLUSTERTOOL_")]
            fill_area(env_start, env_end, ours + rest)
            fill_area(arg_start, arg_end, [sys.executable, *argv])
            set_name(os.path.basename(argv[0]))
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(self.script)
            import runpy

            try:
                runpy.run_path(self.script, run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    sys.stderr.write(f"{exc.code}\n")
            except KeyboardInterrupt:
                code = 130
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            import atexit

            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code & 0xFF)

    def close(self):
        try:
            if stamp(self.path) == self.sock_stamp:
                os.unlink(self.path)
        except OSError:
            pass


def send(conn, obj):
    conn.sendall(json.dumps(obj).encode() + b"\n")


def receive(conn):
    """One JSON line and the file descriptors that came with it."""
    data, fds = b"", []  # type: bytes, list[int]
    while not data.endswith(b"\n"):
        msg, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(16 * array.array("i").itemsize))
        if not msg:
            raise ValueError("closed")
        data += msg
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[:len(payload) - len(payload) % got.itemsize])
                fds.extend(got)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("3 descriptors expected")
    return json.loads(data), fds


def main():
    script, path = sys.argv[2:4]  # argv[1], the key, names this process in ps
    if not hasattr(os, "pidfd_open"):  # Python < 3.9: no warm launcher (the agent starts each launcher itself)
        return 0
    import fcntl

    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # one is there already (or starting)
    server = Server(script, path, lock)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if not server.modules or not server.warm():
        return 0
    server.listen()
    try:
        server.serve()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
