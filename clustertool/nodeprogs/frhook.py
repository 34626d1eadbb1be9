"""clustertool's Flight Recorder hook (stdlib only): PyTorch's record of a rank's last collectives, dumped on request.

The job agent writes this file as ``sitecustomize.py`` in the job's ``fr/py/`` on each node and puts that folder
first on the ranks' PYTHONPATH (with ``CLUSTERTOOL_FR_DIR``, the job's ``fr/``), so Python runs it at start-up,
before the user's program.  In a rank (RANK set, and not a child the rank started) it makes a named pipe
``fr/pipe.<pid>`` and waits on it in a daemon thread: nothing else, no import of torch.  When `clustertool stacks`
(or the supervisor's hang check) writes to the pipe, the thread asks torch for the Flight Recorder's dump
(``torch._C._distributed_c10d._dump_fr_trace()``; ``_dump_nccl_trace()`` for an NCCL process group) and writes
``fr/dump.<pid>``: one JSON line (backend, torch version, rank, or why there is no dump), then the dump's pickle.
torch 2.13's gloo backend records every collective (the last 2000, TORCH_FR_BUFFER_SIZE) but dumps only when the
process asks: this is how a hung rank's record gets out while its main thread waits in a collective.  Then the
user's own sitecustomize, if any, runs as it would have.
"""

import json
import os
import sys
import threading


def dump(folder, pid):
    """The dump of this process's Flight Recorder (or why not) into ``fr/dump.<pid>``, atomically."""
    meta, data = {"pid": pid}, b""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            meta["none"] = "torch.distributed is not initialised in this process"
        else:
            torch = sys.modules["torch"]
            c10d = torch._C._distributed_c10d
            backend = str(dist.get_backend())
            meta.update(backend=backend, torch=torch.__version__, rank=dist.get_rank(), world=dist.get_world_size())
            nccl = "nccl" in backend and hasattr(c10d, "_dump_nccl_trace")
            if not nccl and not hasattr(c10d, "_dump_fr_trace"):
                meta["none"] = "this torch has no Flight Recorder dump for the %s backend" % backend
            else:
                data = c10d._dump_nccl_trace() if nccl else c10d._dump_fr_trace()
    except Exception as exc:  # noqa: BLE001  (the rank goes on whatever happens here)
        meta["none"] = "the dump failed: %s: %s" % (type(exc).__name__, exc)
    path = os.path.join(folder, "dump.%d" % pid)
    with open(path + ".tmp", "wb") as fh:
        fh.write(json.dumps(meta).encode() + b"\n" + data)
    os.replace(path + ".tmp", path)


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def serve(folder, pid):
    """Answer requests on ``fr/pipe.<pid>`` for as long as the rank lives.  The pipe is open for reading before it
    has its name (made as ``.new``, opened, then renamed), and held open for writing by this thread too, so a
    request never finds it without a reader (a writer's open would fail with ENXIO) nor does a read end between
    requests: every write wakes the loop, requests that come during a dump are answered by the next one."""
    import atexit

    pipe = os.path.join(folder, "pipe.%d" % pid)
    tmp = pipe + ".new"
    try:
        remove(tmp)
        os.mkfifo(tmp, 0o600)
        fd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK)
        os.open(tmp, os.O_WRONLY)  # held, never closed: the read below never sees end-of-file
        os.set_blocking(fd, True)
        os.replace(tmp, pipe)
    except OSError:
        remove(tmp)
        return
    atexit.register(remove, pipe)
    while True:
        try:
            if os.read(fd, 4096):
                dump(folder, pid)
        except OSError:
            return


OLD_SIZE, NEW_SIZE = "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"


def buffer_name():
    """The agent's record size (CLUSTERTOOL_FR_SET names what it set) under the name this rank's torch reads: a
    torch that reads TORCH_FR_BUFFER_SIZE prints a deprecation line for the NCCL name.  Which one it reads is
    in its own distributed_c10d.py, read here as text (torch is not imported)."""
    if os.environ.get("CLUSTERTOOL_FR_SET") != OLD_SIZE or NEW_SIZE in os.environ or OLD_SIZE not in os.environ:
        return
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return
        with open(os.path.join(os.path.dirname(spec.origin), "distributed", "distributed_c10d.py"), "rb") as fh:
            renamed = NEW_SIZE.encode() in fh.read()
    except (ImportError, ValueError, OSError):
        return
    if renamed:
        os.environ[NEW_SIZE] = os.environ.pop(OLD_SIZE)


def start():
    buffer_name()
    folder, pid = os.environ.get("CLUSTERTOOL_FR_DIR"), os.getpid()
    owner = os.environ.get("CLUSTERTOOL_FR_PID")
    if not folder or os.environ.get("RANK") is None or (owner and owner != str(pid)):
        return  # not a rank, or a process the rank started (a data loader worker, a subprocess)
    os.environ["CLUSTERTOOL_FR_PID"] = str(pid)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return
    threading.Thread(target=serve, args=(folder, pid), name="clustertool-flight-recorder", daemon=True).start()


def chain():
    """The sitecustomize this file hides (the next one on sys.path), run as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    try:
        start()
    finally:
        chain()
