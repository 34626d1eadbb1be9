"""PyTorch's Flight Recorder of a job's ranks on this node (stdlib only; a part of the ``stacks`` program).

A rank started by the job agent runs clustertool's hook (frhook.py): it dumps its Flight Recorder into
``fr/dump.<pid>`` when something writes to ``fr/pipe.<pid>``.  ``request`` writes to every rank's pipe at once,
then ``collect`` waits (up to a timeout) for the dumps and turns each into a summary: per process group the last
collective enqueued, started and completed, and the rank's last few collectives (sequence number, operation,
state, sizes).  A dump NCCL wrote by itself on a timeout (``fr/nccl_<rank>``, TORCH_NCCL_DEBUG_INFO_TEMP_FILE) is
read where no fresh dump came.  The dump is a pickle of plain data: it is read with an unpickler that refuses
every class (nothing in it runs here).
"""

import io
import json
import os
import pickle
import time

LAST = 8  # collectives a rank's summary keeps


class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("not plain data: %s.%s" % (module, name))


def plain_pickle(data):
    return PlainData(io.BytesIO(data)).load()


def request(folder, pids):
    """Ask each rank's hook for a dump; {pid: why not} for those that cannot be asked."""
    asked, why = time.time(), {}
    for pid in pids:
        pipe = os.path.join(folder, "pipe.%d" % pid)
        if not os.path.exists(pipe):
            why[pid] = ("no Flight Recorder hook in this rank (node launchers' ranks have it, unless their command "
                        "sets PYTHONPATH itself: use -x PYTHONPATH=...; mpirun's own ranks do not)")
            continue
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"dump\n")
            os.close(fd)
        except OSError as exc:
            why[pid] = "the rank's hook did not take the request (%s)" % exc.strerror
    return asked, why


def summary(meta, doc):
    """The part of a dump that folds across ranks."""
    out = {"status": "ok", "backend": meta.get("backend"), "torch": meta.get("torch"), "rank": meta.get("rank"),
           "pgs": {}, "last": []}
    config = doc.get("pg_config") or {}
    for pg, st in (doc.get("pg_status") or {}).items():
        out["pgs"][str(pg)] = {"enqueued": st.get("last_enqueued_collective"),
                               "started": st.get("last_started_collective"),
                               "completed": st.get("last_completed_collective")}
    for e in (doc.get("entries") or [])[-LAST:]:
        name = (e.get("process_group") or ("", ""))[0]
        out["last"].append({"pg": str(e.get("pg_id")), "pg_name": name, "seq": e.get("collective_seq_id"),
                            "p2p": bool(e.get("is_p2p")), "op": e.get("profiling_name"), "state": e.get("state"),
                            "sizes": e.get("input_sizes")})
    out["pg_ranks"] = {str(k): (v or {}).get("ranks") for k, v in config.items()}
    return out


def read_dump(path):
    """(meta, summary) of a dump file; None where it cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    head, _, rest = data.partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:  # NCCL's own dump (no header line): the pickle alone
        meta, rest = {"backend": "nccl"}, data
    if meta.get("none"):
        return {"status": "none", "why": meta["none"]}
    try:
        doc = plain_pickle(rest)
    except Exception as exc:  # noqa: BLE001  (a dump cut short or of another form)
        return {"status": "none", "why": "unreadable dump: %s" % exc}
    if not isinstance(doc, dict):
        return {"status": "none", "why": "unreadable dump"}
    return summary(meta, doc)


def collect(folder, pids, ranks, asked, why, timeout):
    """{pid: summary} once every asked rank's dump is there (newer than the request) or ``timeout`` passed."""
    wanted = [p for p in pids if p not in why]
    deadline = time.time() + timeout

    def fresh(pid):
        try:
            return os.path.getmtime(os.path.join(folder, "dump.%d" % pid)) >= asked - 0.01
        except OSError:
            return False

    while time.time() < deadline and not all(fresh(p) for p in wanted):
        time.sleep(0.05)
    out = {}
    for pid in pids:
        got = read_dump(os.path.join(folder, "dump.%d" % pid)) if pid not in why and fresh(pid) else None
        if got is None and ranks.get(pid) is not None:  # NCCL's own dump on its timeout, if it wrote one
            got = read_dump(os.path.join(folder, "nccl_%d" % ranks[pid]))
        if got is None:
            got = {"status": "none", "why": why.get(pid) or "no dump within %gs (the rank's first dump loads "
                                                              "symbols: try again)" % timeout}
        out[pid] = got
    return out
