"""The GPU proof's helper processes: CUDA MPS, the reduction servers, and signals that wait for cleanup.

Everything started here is stopped here, by its own process id (or, for MPS, whose daemons fork
away from us, by the marker CLUSTERTOOL_PROOF_MPS=<tag> in their environment), also when the proof
is interrupted: a SIGINT/SIGTERM/SIGALRM that arrives inside `cleanup()` waits until it ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"
MARK = "CLUSTERTOOL_PROOF_MPS"


class Interrupted(Exception):
    pass


_SIG = {"defer": 0, "pending": None}


def on_signal(signum, frame):
    name = signal.Signals(signum).name
    if _SIG["defer"]:
        _SIG["pending"] = _SIG["pending"] or name
        return
    raise Interrupted(name)


@contextmanager
def cleanup():
    """A block a signal does not cut short; the signal is raised when it ends (unless it ends by
    an exception, which already unwinds)."""
    _SIG["defer"] += 1
    try:
        yield
    finally:
        _SIG["defer"] -= 1
    if not _SIG["defer"] and _SIG["pending"]:
        name, _SIG["pending"] = _SIG["pending"], None
        raise Interrupted(name)


def take_pending() -> str | None:
    name, _SIG["pending"] = _SIG["pending"], None
    return name


def stop_group(procs: list[subprocess.Popen], grace: float) -> None:
    """TERM each process's session (each was started with start_new_session), KILL what is left
    after `grace` seconds, and reap them all."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        ends = time.monotonic() + wait
        while any(p.poll() is None for p in alive) and time.monotonic() < ends:
            time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.wait()


# ---------------- reduction servers ----------------
@dataclass
class Reducers:
    procs: list[subprocess.Popen] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    error: str | None = None


def start_reducers(argvs: list[list[str]], port_files: list[Path], logs: list[Path], env: dict[str, str],
                   wait_s: float = 10.0) -> Reducers:
    """Start every reducer, then wait until each has written its port file (ADDR:PORT). One that
    exits or stays silent: all are stopped and `error` says which and why (its log's last line)."""
    red = Reducers(logs=logs)
    for argv, log in zip(argvs, logs):
        with open(log, "w") as fh:
            red.procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                              stderr=subprocess.STDOUT, start_new_session=True))
    ends = time.monotonic() + wait_s
    while True:
        ready = [f.is_file() and f.read_text().strip() for f in port_files]
        dead = [i for i, p in enumerate(red.procs) if p.poll() is not None and not ready[i]]
        if all(ready) or dead or time.monotonic() > ends:
            break
        time.sleep(0.05)
    if all(ready):
        red.endpoints = [str(r) for r in ready]
        return red
    i = dead[0] if dead else ready.index(False)
    stop_group(red.procs, 3.0)
    tail = (logs[i].read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
    how = f"exited {red.procs[i].returncode}" if dead else f"wrote no port file within {wait_s:.0f} s"
    red.error = f"reduction server {i} ({' '.join(argvs[i][-7:])}) {how}: {tail[:300]}"
    return red


# ---------------- CUDA MPS ----------------
@dataclass
class Mps:
    on: bool = False
    note: str = "off"
    env: dict[str, str] = field(default_factory=dict)   # what every CUDA client (rank) needs
    pipe_dir: str | None = None
    binary: str | None = None
    tag: str = ""


# A CUDA client of the driver API (ctypes, no torch: it takes milliseconds): under MPS its context is
# what connects to the MPS server. Exit 0 "ok", or 0 "no libcuda" (cannot tell: the torch probe will),
# or 1 with the failing call.
CTX_PROBE = r"""
import ctypes, sys
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError:
    print("no libcuda"); sys.exit(0)
dev, ctx, mem = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
for name, call in (("cuInit", lambda: cu.cuInit(0)), ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                   ("cuDevicePrimaryCtxRetain", lambda: cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
                   ("cuCtxSetCurrent", lambda: cu.cuCtxSetCurrent(ctx)),
                   ("cuMemAlloc", lambda: cu.cuMemAlloc_v2(ctypes.byref(mem), ctypes.c_size_t(1 << 20))),
                   ("cuMemFree", lambda: cu.cuMemFree_v2(mem))):
    rc = call()
    if rc:
        print(f"{name} returned CUDA error {rc}"); sys.exit(1)
cu.cuDevicePrimaryCtxRelease_v2(dev)
print("ok")
"""


def mps_client_check(env: dict[str, str], timeout: float = 30.0) -> str | None:
    """Why a CUDA context fails under MPS, or None (it works, or there is no libcuda to tell)."""
    try:
        proc = subprocess.run([sys.executable, "-c", CTX_PROBE], env=dict(os.environ, **env), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"a CUDA context did not come up within {timeout:.0f} s"
    except OSError as e:
        return str(e)
    if proc.returncode == 0:
        return None
    return (proc.stdout.strip() or proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[-1][:200]


def _mps_control(mps: Mps, command: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, **mps.env, **{MARK: mps.tag})
    return subprocess.run([str(mps.binary)], input=command + "\n", env=env, capture_output=True, text=True,
                          timeout=timeout)


def start_mps(log_dir: Path, tag: str, skip: bool) -> Mps:
    """Start the MPS control daemon (`nvidia-cuda-mps-control -d`) with its pipe and log folders
    of our own; where that cannot be, an Mps that is off and says why (the proof goes on without)."""
    if skip:
        return Mps(note="off (--no-mps)")
    binary = shutil.which(MPS_CONTROL)
    if not binary:
        return Mps(note=f"off ({MPS_CONTROL} not found: the ranks take turns on the GPU)")
    log_dir.mkdir(parents=True, exist_ok=True)
    pipe = tempfile.mkdtemp(prefix="ct-mps-")   # short: MPS's pipes are sockets, paths <= 108 bytes
    mps = Mps(env={"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}, pipe_dir=pipe,
              binary=binary, tag=tag)
    try:
        proc = subprocess.run([binary, "-d"], env=dict(os.environ, **mps.env, **{MARK: tag}), capture_output=True,
                              text=True, timeout=20)
        why = None if proc.returncode == 0 else f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
        ends = time.monotonic() + 10
        while why is None:   # the daemon answers once its control pipe is up
            q = _mps_control(mps, "get_server_list", timeout=5)
            if q.returncode == 0:
                break
            if time.monotonic() > ends:
                why = f"the daemon does not answer: {(q.stderr or q.stdout).strip()[:200]}"
            time.sleep(0.2)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)[:200]
    if why:
        stop_mps(mps)
        return Mps(note=f"off ({MPS_CONTROL} -d failed, {why})")
    if client := mps_client_check(mps.env):
        stop_mps(mps)
        return Mps(note=f"off (the daemon started, but a CUDA context under it failed: {client})")
    mps.on, mps.note = True, f"on (control daemon, pipes in {pipe})"
    return mps


def _marked_pids(tag: str) -> list[int]:
    """Processes whose environment carries MARK=tag: the MPS daemons this proof started."""
    want = f"{MARK}={tag}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if want in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def stop_mps(mps: Mps) -> str | None:
    """`quit` to the control daemon (it stops its server too), then TERM/KILL whatever of ours is
    left; the pipe folder is removed. Returns a note when the daemon had to be killed."""
    if not mps.binary or not mps.tag:
        return None
    note = None
    try:
        _mps_control(mps, "quit")
    except (OSError, subprocess.TimeoutExpired) as e:
        note = f"MPS quit failed ({e})"
    for sig, wait in ((None, 5.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        pids = _marked_pids(mps.tag)
        if not pids:
            break
        if sig is not None:
            note = f"MPS daemon(s) {' '.join(map(str, pids))} did not quit: sent {signal.Signals(sig).name}"
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        ends = time.monotonic() + wait
        while _marked_pids(mps.tag) and time.monotonic() < ends:
            time.sleep(0.1)
    if mps.pipe_dir:
        shutil.rmtree(mps.pipe_dir, ignore_errors=True)
    mps.on = False
    return note
