"""Standalone program (stdlib only): the Python stack of every rank of a job on this node.

Every rank of a job writes ``~/.clustertool/jobs/<job>/ranks/<uname -n>.<rank>`` ("pid ppid
pgid sid", the pid being the rank's own process, e.g. python).  For each of this node's records
whose process is alive and carries ``CLUSTERTOOL_JOB=<job>`` in its environment (a reused pid
does not), this program asks ``py-spy dump --json`` for the stack of every thread, all ranks at
once, each time-boxed.  Where py-spy is missing, switched off or fails (not permitted, a
Python it does not know), the rank still gets what /proc says: its state (R, S, D ...), the
kernel function it waits in (wchan), the system call it is in, its CPU time and its command
line.  Each rank says which method gave its answer.  Beside the stacks, each live rank's Flight Recorder
(PyTorch's record of its last collectives) is asked for at once and summed up (flightrec.py, the part that comes
first; ``flight`` false: not asked).  The program prints one JSON document.

``ARGS`` (prepended by the sender, see ``program_text``)::

    job       the job id
    jobs_dir  the jobs folder relative to $HOME (".clustertool/jobs")
    env       the job's marker variable ("CLUSTERTOOL_JOB")
    py_spy    false: do not use py-spy (/proc only); else a list of py-spy paths to try first
              (then: PATH, next to this python, next to the rank's python (its binary and
              the path it was started by), the bin/ of the rank's VIRTUAL_ENV and of the
              environment of a site-packages on its PYTHONPATH, its PATH, ~/.local/bin)
    timeout   seconds for one rank's py-spy
"""

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

if "collect" not in globals():  # imported (tests); on a node the part comes first
    from clustertool.nodeprogs.flightrec import collect, request

ERROR_MAX = 300

# System call numbers of the calls a stuck process usually sits in (x86_64, aarch64).
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield", 35: "nanosleep",
               42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
               61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
               270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 441: "epoll_pwait2",
               449: "futex_waitv"},
    "aarch64": {22: "epoll_pwait", 29: "ioctl", 63: "read", 64: "write", 72: "pselect6", 73: "ppoll",
                95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 124: "sched_yield",
                202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg",
                242: "accept4", 260: "wait4", 441: "epoll_pwait2", 449: "futex_waitv"},
}


def _read(path, mode="r"):
    try:
        with open(path, mode) as fh:
            return fh.read()
    except OSError:
        return None


def rank_records(job_dir, host):
    """[(rank, pid)] of this node's rank records, by rank."""
    folder = os.path.join(job_dir, "ranks")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        node, _, rank = name.rpartition(".")
        fields = (_read(os.path.join(folder, name)) or "").split()
        if node == host and rank.isdigit() and fields[:1] and fields[0].isdigit():
            out.append((int(rank), int(fields[0])))
    return sorted(out)


def environ(pid):
    """The process's environment as a dict (None: gone or not readable)."""
    data = _read(f"/proc/{pid}/environ", "rb")
    if data is None:
        return None
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def py_spy_candidates(args, pid, env):
    """Where py-spy may be, in the order tried."""
    found = list(args.get("py_spy") or [])
    found.append(shutil.which("py-spy") or "")
    found.append(os.path.join(os.path.dirname(sys.executable), "py-spy"))
    try:
        found.append(os.path.join(os.path.dirname(os.readlink(f"/proc/{pid}/exe")), "py-spy"))
        argv0 = (_read(f"/proc/{pid}/cmdline", "rb") or b"").split(b"\0")[0].decode(errors="replace")
        if "/" in argv0:  # a virtualenv's bin/python: its own path, not the interpreter it links to
            found.append(os.path.join(os.path.dirname(os.path.join(os.readlink(f"/proc/{pid}/cwd"), argv0)),
                                      "py-spy"))
    except OSError:
        pass
    for entry in env.get("PYTHONPATH", "").split(":"):  # a site-packages dir: the bin/ of its environment
        if entry.rstrip("/").endswith("-packages"):
            found.append(os.path.join(entry, "..", "..", "..", "bin", "py-spy"))
    if env.get("VIRTUAL_ENV"):
        found.append(os.path.join(env["VIRTUAL_ENV"], "bin", "py-spy"))
    found += [os.path.join(d, "py-spy") for d in env.get("PATH", "").split(":") if d]
    found.append(os.path.expanduser("~/.local/bin/py-spy"))
    return found


def find_py_spy(args, pid, env):
    return next((p for p in py_spy_candidates(args, pid, env) if _executable(p)), None)


def threads_from_py_spy(dump):
    """py-spy's ``dump --json`` (a list of threads) -> our threads: name, id, active, gil, frames
    (innermost first: function, file, line)."""
    threads = []
    for t in dump:
        frames = [{"function": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
                  for f in t.get("frames") or []]
        threads.append({"name": t.get("thread_name"), "id": t.get("os_thread_id"), "active": t.get("active"),
                        "gil": t.get("owns_gil"), "frames": frames})
    return threads


def error_line(text):
    """The line that says what went wrong: py-spy's "Error: ..." (a backtrace follows it), else the last."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("Error:")] or lines[-1:]
    return said[0][-ERROR_MAX:] if said else ""


def py_spy_dump(exe, pid, timeout):
    """(threads, None) or (None, why py-spy gave nothing)."""
    try:
        proc = subprocess.run([exe, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g}s"
    except OSError as exc:
        return None, str(exc)
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {error_line(proc.stderr) or error_line(proc.stdout)}"
    try:
        return threads_from_py_spy(json.loads(proc.stdout)), None
    except (ValueError, AttributeError, TypeError):
        return None, "unreadable output: " + error_line(proc.stdout)


def syscall_name(text, machine=None):
    """/proc/PID/syscall's first word as a name: "futex", "running", "none" (not in a call)."""
    word = (text or "").split()[:1]
    if not word:
        return None
    if word[0] == "running":
        return "running"
    if word[0] == "-1":
        return "none"
    try:
        number = int(word[0])
    except ValueError:
        return word[0]
    return SYSCALLS.get(machine or platform.machine(), {}).get(number, f"syscall {number}")


def _stat_fields(pid, task=None):
    text = _read(f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat")
    return text.rpartition(")")[2].split() if text else []


def proc_info(pid):
    """What /proc says of the process: state, wchan, syscall, cpu seconds, cmdline, thread states."""
    fields = _stat_fields(pid)
    if not fields:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    cmdline = [a.decode(errors="replace") for a in (_read(f"/proc/{pid}/cmdline", "rb") or b"").split(b"\0") if a]
    wchan = (_read(f"/proc/{pid}/wchan") or "").strip()
    threads: dict = {}
    for task in sorted(os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}/task") else []:
        state = (_stat_fields(pid, task) or ["?"])[0]
        threads[state] = threads.get(state, 0) + 1
    return {"state": fields[0], "wchan": wchan if wchan not in ("", "0") else None,
            "syscall": syscall_name(_read(f"/proc/{pid}/syscall")),
            "cpu_s": round((int(fields[11]) + int(fields[12])) / ticks, 2), "cmdline": shlex.join(cmdline),
            "threads": threads}


def look(args, rank, pid):
    """One rank: its stack by py-spy, else what /proc says."""
    out = {"rank": rank, "pid": pid, "alive": False, "method": None, "py_spy": None, "threads": None,
           "proc": None, "note": None}
    env = environ(pid)
    if env is None or env.get(args["env"]) != args["job"]:
        out["note"] = "process gone" if env is None else f"pid {pid} is another process now"
        return out
    out["alive"], out["proc"] = True, proc_info(pid)
    if args.get("py_spy") is False:
        out["method"], out["note"] = "proc", "py-spy switched off"
        return out
    exe = find_py_spy(args, pid, env)
    if exe is None:
        out["method"], out["note"] = "proc", "py-spy not found"
        return out
    threads, why = py_spy_dump(exe, pid, float(args.get("timeout") or 10))
    out["py_spy"] = exe
    if threads is None:
        out["method"], out["note"] = "proc", f"py-spy failed: {why}"
    else:
        out["method"], out["threads"] = "py-spy", threads
    return out


def ours(args, pid):
    return (environ(pid) or {}).get(args["env"]) == args["job"]


def main(args):
    host = os.uname().nodename
    job_dir = os.path.join(os.path.expanduser("~"), args["jobs_dir"], args["job"])
    records = rank_records(job_dir, host)
    folder, live = os.path.join(job_dir, "fr"), {pid: rank for rank, pid in records if ours(args, pid)}
    if args.get("flight", True):
        asked, why = request(folder, list(live))
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(records)))) as pool:
        ranks = list(pool.map(lambda r: look(args, *r), records))
    if args.get("flight", True):
        flights = collect(folder, list(live), live, asked, why, float(args.get("timeout") or 10))
        for entry in ranks:
            entry["flight"] = flights.get(entry["pid"]) if entry["alive"] else None
    json.dump({"host": host, "job_dir": os.path.isdir(job_dir), "ranks": ranks}, sys.stdout)
    sys.stdout.write("\n")


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    main(ARGS)  # noqa: F821
