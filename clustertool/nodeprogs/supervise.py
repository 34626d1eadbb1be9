"""The job supervisor, beside mpirun on the leader (stdlib only; never imports clustertool).

mpirun already stops the whole job when a rank (or a node's launcher) exits non-zero or is killed.
What it does not see in time is a node that stops answering: a crashed or cut-off machine leaves
the other ranks waiting in a collective until the backend's own timeout.  This program asks every
other node of the job, every ``interval`` seconds, whether its ssh port still takes a connection;
when one has not for ``misses`` rounds in a row, it writes ``lost`` in the job's folder (which node,
since when) and stops mpirun (TERM, then KILL after ``grace`` seconds), whose daemons on the nodes
that still answer then stop their ranks.

``ARGS`` (prepended by the sender): ``job_dir``, ``nodes`` ([name, address, port] of the other
nodes), ``interval``, ``misses``, ``grace``.  It ends with the job (mpirun's pid gone).
"""

import json
import os
import signal
import socket
import threading
import time


def answers(address, port, timeout):
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_pid(path, wait_s=30.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.1)
    return None


def probe_all(nodes, timeout):
    """{name: answered} for every node, probed at once."""
    result = {}

    def one(node):
        result[node[0]] = answers(node[1], int(node[2]), timeout)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return {n[0]: result.get(n[0], False) for n in nodes}


def stop(pid, grace):
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def stragglers(job_id):
    """This job's ssh clients left on the leader (mpirun's, to the lost node: they wait on a dead link)."""
    marker = f"CLUSTERTOOL_JOB={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                if fh.read().strip() != "ssh":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def main(args):
    d = args["job_dir"]
    pid = read_pid(os.path.join(d, "mpirun.pid"))
    if pid is None or not args["nodes"]:
        return
    interval, misses = float(args.get("interval", 2.0)), int(args.get("misses", 3))
    missed: dict = {}
    since: dict = {}
    while alive(pid) and not os.path.exists(os.path.join(d, "exit.tmp")):
        started = time.monotonic()
        for name, ok in probe_all(args["nodes"], interval).items():
            if ok:
                missed.pop(name, None)
                since.pop(name, None)
                continue
            missed[name] = missed.get(name, 0) + 1
            since.setdefault(name, time.time())
        gone = [n for n, count in missed.items() if count >= misses]
        if gone:
            first = min(gone, key=lambda n: since[n])
            record = {"node": first, "time": since[first], "what": "stopped answering", "nodes": sorted(gone)}
            tmp = os.path.join(d, "lost.tmp")
            with open(tmp, "w") as fh:
                json.dump(record, fh)
            os.replace(tmp, os.path.join(d, "lost"))
            with open(os.path.join(d, "log"), "a") as fh:
                fh.write(f"clustertool: {first} stopped answering (no ssh connection for {misses} rounds of "
                         f"{interval:g}s); stopping the job\n")
            stop(pid, float(args.get("grace", 5.0)))
            for straggler in stragglers(os.path.basename(d.rstrip("/"))):
                try:
                    os.kill(straggler, signal.SIGKILL)
                except OSError:
                    pass
            return
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    main(ARGS)  # noqa: F821
