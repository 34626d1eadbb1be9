"""PID 1 of a local node: set up the node's private view, start sshd, reap orphans.

Run as ``python -I -S init.py CONFIG.json`` inside fresh UTS, mount and PID
namespaces (see ``net.node_start_argv``).  Standard library only, no clustertool
import, so it starts in milliseconds.  The config (``net.init_config``) says the
hostname, which host directories to bind over /root, /scratch, /tmp, /etc/hosts, which
tmpfs to mount, the sshd command and the node's boot scripts (boot.sh, then boot.d/*.sh, run when they exist).

As PID 1 of its namespace this process ignores every signal sent from inside the node
that it has no handler for, so ``pkill -9 python`` on the node cannot take the node down;
its name is set to ``ct-init`` so such patterns do not even match it.  The host stops the
node with SIGKILL, which kills the whole PID namespace.  When sshd exits, so does PID 1
(the node is down).
"""

from __future__ import annotations  # annotations stay strings: nothing to import or evaluate at start

import ctypes
import json
import os
import signal
import socket
import sys

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
PR_SET_NAME = 15


def _mount(libc: ctypes.CDLL, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = libc.mount(source.encode(), target.encode(),
                    fstype.encode() if fstype else None, flags,
                    data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s on %s: %s" % (source, target, os.strerror(err)))


def _default_signals() -> None:
    # Python ignores SIGPIPE/SIGXFSZ and handles SIGINT; give children the usual defaults.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _setup(config: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, b"ct-init", 0, 0, 0)
    socket.sethostname(config["hostname"])
    # Open every source first: a bind over /tmp or /root would otherwise hide sources below it.
    sources = [(os.open(source, os.O_PATH | os.O_CLOEXEC), source, target)
               for source, target in config["binds"]]
    # Host software that lives under a now-private directory (a venv or pyenv under /root,
    # a checkout under /tmp) is bound back at its own path, as an AMI would carry it.
    shared = [(os.open(path, os.O_PATH | os.O_CLOEXEC), path, path)
              for path in config.get("shared", []) if os.path.isdir(path)]
    for fd, source, target in sources + shared:
        if (fd, source, target) in shared:
            os.makedirs(target, exist_ok=True)
        _mount(libc, "/proc/self/fd/%d" % fd, target, None, MS_BIND | MS_REC, None)
        os.close(fd)
    for target, options in config["tmpfs"]:
        _mount(libc, "tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)


def _reap_until(child: int) -> int:
    """Reap every process that ends up with us; return the exit code of ``child``."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def _boot_scripts(config: dict) -> list[str]:
    """The node's boot scripts: ``/root/.clustertool/boot.sh`` (what programs installed on the node start
    at every boot, e.g. the autostop watcher), then every ``*.sh`` of ``boot.d`` in name order (Slurm's
    daemons ...), those that exist."""
    found = [config.get("boot")]
    folder = config.get("boot_dir")
    if folder and os.path.isdir(folder):
        found += [os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name.endswith(".sh")]
    return [path for path in found if path and os.path.isfile(path)]


def _start_boot(path: str) -> None:
    """Run one boot script, in a session of its own, its output nowhere."""
    if os.fork() == 0:
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv("/bin/sh", ["sh", path])
        finally:
            os._exit(127)


def main(argv: list[str]) -> int:
    with open(argv[1]) as fh:
        config = json.load(fh)
    _default_signals()
    try:
        _setup(config)
    except OSError as exc:
        sys.stderr.write("ct-init: %s\n" % exc)
        return 1
    os.chdir("/")
    command = config["command"]
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os.execv(command[0], command)
        finally:
            os._exit(127)
    for path in _boot_scripts(config):
        _start_boot(path)
    code = _reap_until(child)
    sys.stderr.write("ct-init: %s exited with %s\n" % (command[0], code))
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
