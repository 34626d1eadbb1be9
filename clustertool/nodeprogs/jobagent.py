#!/usr/bin/env -S python3 -I -S
"""The job agent: one per node for every launcher but mpirun (stdlib only; never imports clustertool).

It runs in two roles, told apart by the environment:

* **node agent** (the leader's fan-out, nodeprogs/fan.py, starts one per node, ``CLUSTERTOOL_AGENT_NODE`` its
  node rank, its stdin the leader's end: closed, it stops as on SIGTERM; in a Slurm job srun starts it,
  ``SLURM_PROCID`` then, jobs/slurmbatch.py; under mpirun ``OMPI_COMM_WORLD_RANK``):
  reads ``agent.json`` beside this file, then either starts that node's launcher (torchrun,
  accelerate launch, deepspeed) with the node's own command line, or (``process``) one process per
  slot itself.  When its launcher or one of its ranks fails, it stops the rest on this node, writes
  ``failure`` (which rank, how it ended, its last stderr lines), says so in one line on stderr, and
  exits non-zero, so the fan-out (or srun) stops the job on every other node.  SIGTERM/SIGINT/SIGHUP are passed
  on; its children die with it (PR_SET_PDEATHSIG).
* **rank runner** (``CLUSTERTOOL_RANK_PROGRAM`` is set; the launcher runs this file as the training
  script, torchrun and accelerate with their ``--no-python``: this file's own #! line then, ``-I -S``, no
  site to load): sends the rank's output to ``out/1/rank.N/std{out,err}`` on this node (the files
  mpirun's ranks write, which `logs` reads), records the rank's process in ``ranks/`` (for `kill`
  and `stacks`), runs the user's program with the launcher's interpreter, passes signals on, and
  records how it ended in ``exits/``.

Files (in the job's folder ``~/.clustertool/jobs/<id>/`` on every node): ``jobagent.py``,
``agent.json`` (the plan: per node its command, processes and first rank), ``ranks/``, ``exits/``,
``out/``, ``failure``.
"""

import json
import os
import signal
import sys
import time

# subprocess: imported only where a node launcher starts (the rank runner, once per rank, forks by itself)

PROGRAM_ENV = "CLUSTERTOOL_RANK_PROGRAM"
NODE_ENV = "CLUSTERTOOL_AGENT_NODE"  # the node rank fan.py gives each agent
# The launchers whose ranks can run this file directly (its #! line) rather than under their own python
NO_PYTHON = {"torchrun": "--no-python", "accelerate": "--no_python"}
RESTART_ENV = "CLUSTERTOOL_RESTART_COUNT"  # run --restarts: which attempt this is (0: the first)
RANK_HOST_ENV = "CLUSTERTOOL_RANK_HOST"  # rankhost.py, relative to the home: how a Python rank is run
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # the forwarded signals that stop the job
# How long children told to stop get before SIGKILL.  Inside fan.py's own grace (4 s) for the leader's agent, which
# it SIGKILLs then: a launcher left behind would outlive the job (torchrun waiting in its exit barrier takes no
# SIGTERM until the barrier's 300 s are up).
STOP_GRACE_S = 3.0
TAIL_LINES = 5
# What MPI put in the agent's environment: a launcher's ranks must not take it for their own.
MPI_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "ORTE_")
# Under Slurm, srun's task variables describe the agents (one task per node); the job's own stay
SLURM_KEPT = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT",
              "SLURM_CONF", "SLURM_JOB_PARTITION", "SLURM_SUBMIT_DIR")


def host():
    return os.uname().nodename  # what `uname -n` says: the name kill.sh looks for in ranks/


def job_dir():
    return os.path.dirname(os.path.abspath(__file__))


def die_with_parent(sig=signal.SIGKILL):
    """In a child, before exec: get ``sig`` when the process that started it dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def write_atomic(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def rank_files(out, rank, width):
    d = os.path.join(out, "1", "rank.%0*d" % (width, rank))
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "stdout"), os.path.join(d, "stderr")


def record_rank(rank, pid):
    """ranks/<host>.<rank>: "pid ppid pgid sid" of the rank's process (what kill and stacks read)."""
    d = os.path.join(job_dir(), "ranks")
    os.makedirs(d, exist_ok=True)
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ppid, pgid, sid = fields[1], fields[2], fields[3]
    except (OSError, IndexError):
        ppid, pgid, sid = str(os.getpid()), "0", "0"
    write_atomic(os.path.join(d, f"{host()}.{rank}"), f"{pid} {ppid} {pgid} {sid}\n")


def record_exit(rank, status, stopped):
    """exits/<host>.<rank>: how the rank ended (code or signal), when, and whether it was told to stop."""
    d = os.path.join(job_dir(), "exits")
    os.makedirs(d, exist_ok=True)
    code, sig = (None, -status) if status < 0 else (status, None)
    write_atomic(os.path.join(d, f"{host()}.{rank}"),
                 json.dumps({"rank": rank, "node": host(), "code": code, "signal": sig, "time": time.time(),
                             "stopped": stopped}))


def tail(path, lines=TAIL_LINES):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


class Stopper:
    """Passes the signals it gets on to the children; remembers that we were told to stop.  ``kill_after``:
    once told, the children still there that many seconds later get SIGKILL (a child that ignores SIGTERM, or
    cannot take it yet, ends anyway)."""

    def __init__(self, kill_after=None):
        self.children = []
        self.told = None
        self.kill_after = kill_after
        self.timed = False  # the SIGKILL timer started (by the first stopping signal)
        for sig in FORWARDED:
            signal.signal(sig, self.handle)

    def handle(self, sig, _frame):
        if self.told is None:
            self.told = sig
        for child in self.children:
            try:
                child.send_signal(sig)
            except OSError:
                pass
        # the first stopping signal starts the timer; USR1 ... (a preemption notice) stops nothing
        if self.kill_after is not None and sig in STOPPING and not self.timed:
            import threading

            self.timed = True
            timer = threading.Timer(self.kill_after, self.kill_all)
            timer.daemon = True
            timer.start()

    def kill_all(self):
        for child in list(self.children):
            try:
                child.kill()
            except OSError:
                pass


def rank_command(program, args, host=None):
    """The rank's command; ``host``: rankhost.py, which a Python script rank runs under (a script that ended
    well then ends its process well: see rankhost.py)."""
    mode = program.get("mode", "python")
    if mode == "exec":
        argv = list(program.get("argv") or [program["target"], *args])
        python = os.path.basename(argv[0]).startswith("python") and os.path.basename(argv[0])[6:7] in ("", "3")
        if host and python and len(argv) > 1 and (argv[1] == "-m" or not argv[1].startswith("-")):
            return [argv[0], host, *argv[1:]]
        return argv
    hosted = [host] if host else []
    python = program.get("python") or sys.executable  # the launcher's interpreter (where we run without it)
    if mode == "module":
        return [python, "-u", *hosted, "-m", program["target"], *args]
    return [python, "-u", *hosted, program["target"], *args]


def rank_host(env):
    """rankhost.py's path on this node (None where it is not there), taken out of what the rank inherits."""
    rel = env.pop(RANK_HOST_ENV, None)
    path = os.path.join(os.path.expanduser("~"), rel) if rel else None
    return path if path and os.path.isfile(path) else None


def flight_env(env, folder=None):
    """The Flight Recorder's hook for a rank (nodeprogs/frhook.py as fr/py/sitecustomize.py, put there at install):
    its folder first on PYTHONPATH, and NCCL's own dump on timeout into fr/ (the user's settings win;
    CLUSTERTOOL_FR=0 turns it all off)."""
    folder = folder or os.path.join(job_dir(), "fr")
    if env.get("CLUSTERTOOL_FR") == "0" or not os.path.exists(os.path.join(folder, "py", "sitecustomize.py")):
        return env
    env = dict(env, CLUSTERTOOL_FR_DIR=folder)
    env["PYTHONPATH"] = os.path.join(folder, "py") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env and "TORCH_FR_BUFFER_SIZE" not in env:
        # the hook gives it the name the rank's torch reads (a recent one warns of this one)
        env.update(TORCH_NCCL_TRACE_BUFFER_SIZE="2000", CLUSTERTOOL_FR_SET="TORCH_NCCL_TRACE_BUFFER_SIZE")
    for key, value in (("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
                       ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(folder, "nccl_"))):
        env.setdefault(key, value)
    return env


def start_rank(program, args, rank, out, width, env):
    env = flight_env(env)
    stdout, stderr = rank_files(out, rank, width)
    env = dict(env)
    child = spawn(rank_command(program, args, rank_host(env)), stdout, stderr, env)
    record_rank(rank, child.pid)
    return child


class Child:
    """A process spawn() started: what Stopper and wait() use of a Popen."""

    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self):
        if self.returncode is None:
            self.returncode = decode_status(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = decode_status(status)
        return self.returncode

    def kill(self):
        self.send_signal(signal.SIGKILL)


def own_group():
    """In the launcher, before exec: a process group of its own (Python 3.8's Popen has no process_group), and
    SIGTERM when the agent dies."""
    os.setpgid(0, 0)
    die_with_parent(signal.SIGTERM)


class Group:
    """A launcher in its own process group, with all it started (DeepSpeed's runner starts its per-node launcher,
    which starts the ranks): signals go to the whole group, as mpirun's daemons sent them, so a launcher that
    dies of SIGTERM leaves nothing behind."""

    def __init__(self, proc):
        self.proc, self.pid, self.stderr = proc, proc.pid, proc.stderr

    def send_signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def wait(self):
        return self.proc.wait()

    def poll(self):
        return self.proc.poll()

    def alive(self):
        try:
            os.killpg(self.pid, 0)
            return True
        except OSError:
            return False

    def clear(self):
        """Once the launcher has ended: what is left of its group gets SIGTERM, SIGKILL after the grace."""
        if not self.alive():
            return
        self.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.05)
        self.kill()


WARM_ENV = "CLUSTERTOOL_WARM"  # 0: every node launcher starts cold, as typed by hand
# What a launcher's imports may read of the environment: a warm launcher serves only the jobs whose values of
# these are its own (the key has them)
IMPORT_PREFIXES = ("TORCH", "PYTORCH", "NCCL", "CUDA", "NVIDIA", "OMP_", "MKL_", "KMP_", "LD_", "PYTHON", "LC_",
                   "HF_", "TRANSFORMERS_", "ACCELERATE_", "DS_", "DEEPSPEED", "GLOO", "TP_", "TRITON")
IMPORT_KEYS = ("LOGLEVEL", "LANG", "LANGUAGE", "TZ", "HOME", "USER", "PATH")
WARM_PADS = (16384, 4096)  # room kept in the warm launcher's environment and command line for a launcher's
WARM_KEY_ENV = "CLUSTERTOOL_WARM_KEY"  # marks a warm launcher (doctor's strays check leaves it alone)
WARM_PAD_ENV = "CLUSTERTOOL_WARM_PAD"  # its value is the room in /proc/PID/environ


def warm_plan(word, env):
    """Where this node's warm launcher for ``word`` is (nodeprogs/warmlaunch.py), or None where none is used:
    turned off (CLUSTERTOOL_WARM=0), not started by the leader's fan-out (Slurm's srun, mpirun), or a launcher
    that is not a console script run by a plain python."""
    if env.get(WARM_ENV) == "0" or NODE_ENV not in os.environ or "SLURM_JOB_ID" in env:
        return None
    server = os.path.join(job_dir(), "warmlaunch.py")
    import shutil

    script = shutil.which(word, path=env.get("PATH")) or word
    if os.path.basename(script).startswith("python") or not os.path.isfile(server):
        return None
    python = launcher_python(script, env)
    if not python:
        return None
    import hashlib

    seen = sorted((k, v) for k, v in env.items() if k in IMPORT_KEYS or k.startswith(IMPORT_PREFIXES))
    digest = hashlib.sha256(json.dumps([python, os.path.abspath(script), seen]).encode())
    with open(server, "rb") as fh:
        digest.update(fh.read())
    key = digest.hexdigest()[:16]
    folder = os.path.join(os.path.expanduser("~"), ".clustertool", "warm")
    return {"script": os.path.abspath(script), "python": python, "key": key, "env": dict(seen), "server": server,
            "folder": folder, "path": os.path.join(folder, key + ".sock")}


class Warm(Group):
    """A launcher the warm launcher forked: signals to its group, its end read from the warm launcher."""

    def __init__(self, sock, pid, stderr):
        self.sock, self.pid, self.stderr, self.returncode, self.buf = sock, pid, stderr, None, b""

    def _answer(self, block):
        while b"\n" not in self.buf:
            self.sock.setblocking(block)
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                if not block:
                    return None
                continue
            if not data:  # the warm launcher is gone: its launchers had SIGTERM (their PR_SET_PDEATHSIG)
                self.returncode = -signal.SIGTERM
                return self.returncode
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            self.returncode = int(json.loads(line)["status"])
        except (ValueError, KeyError, TypeError):
            self.returncode = -signal.SIGTERM
        return self.returncode

    def wait(self):
        while self.returncode is None:
            self._answer(True)
        return self.returncode

    def poll(self):
        if self.returncode is None:
            self._answer(False)
        return self.returncode


def warm_start(warm, argv, env):
    """The launcher, forked by this node's warm launcher (a Warm), or None (none there yet, or it says to start
    cold: its files changed)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        if len(warm["path"]) < 100:
            sock.connect(warm["path"])
        else:  # too long for a socket's address: through the folder's descriptor
            folder = os.open(warm["folder"], os.O_PATH)
            try:
                sock.connect(f"/proc/self/fd/{folder}/{os.path.basename(warm['path'])}")
            finally:
                os.close(folder)
        request = json.dumps({"argv": [warm["script"], *argv[1:]], "env": env, "cwd": os.getcwd()}).encode() + b"\n"
        import array

        sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null, 1, write_end]))])
        buf = b""
        while b"\n" not in buf:
            data = sock.recv(4096)
            if not data:
                raise ValueError("closed")
            buf += data
        line, _, rest = buf.partition(b"\n")
        pid = json.loads(line).get("pid")
        if not isinstance(pid, int):
            raise ValueError("cold")
    except (OSError, ValueError):
        sock.close()
        os.close(read_end)
        return None
    finally:
        os.close(null)
        os.close(write_end)
    child = Warm(sock, pid, os.fdopen(read_end, "rb"))
    child.buf = rest
    return child


def start_warm(warm):
    """This node's warm launcher for the next job, started now (detached, at the lowest CPU priority while it
    imports; nothing if one is starting)."""
    try:
        import fcntl
        import subprocess

        os.makedirs(warm["folder"], mode=0o700, exist_ok=True)
        lock = os.open(warm["path"] + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # one is starting (or there)
        finally:
            os.close(lock)
        env = dict(warm["env"], **{WARM_KEY_ENV: warm["key"], WARM_PAD_ENV: "." * WARM_PADS[0]})
        log = os.open(os.path.join(warm["folder"], warm["key"] + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                      0o600)
        try:
            subprocess.Popen([warm["python"], warm["server"], warm["key"], warm["script"], warm["path"],
                              "." * WARM_PADS[1]], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                             cwd=warm["folder"], start_new_session=True)
        finally:
            os.close(log)
    except OSError:
        pass


def spawn(argv, stdout, stderr, env):
    """fork + exec (PATH searched), stdin /dev/null, output appended to the files, SIGKILL when this process
    dies; an exec that fails raises OSError here, as Popen's would."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent()
            for target, (path, flags) in enumerate(((os.devnull, os.O_RDONLY), (stdout, os.O_WRONLY | os.O_APPEND),
                                                    (stderr, os.O_WRONLY | os.O_APPEND))):
                os.dup2(os.open(path, flags | os.O_CREAT, 0o644), target)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(write_end, str(exc.errno).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        failed = fh.read()
    if failed:
        os.waitpid(pid, 0)
        raise OSError(int(failed), os.strerror(int(failed)), argv[0])
    return Child(pid)


def rank_runner():
    """Run by the launcher as its training script: one rank."""
    program = json.loads(os.environ.pop(PROGRAM_ENV))
    die_with_parent(signal.SIGTERM)  # the launcher died: stop the rank too
    rank = int(os.environ.get("RANK", "0"))
    env = dict(os.environ)
    restart = env.get(RESTART_ENV, "")
    if restart.isdigit():  # torchrun sets its own count (0: it restarts nothing itself); the job's comes first
        own = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        env["TORCHELASTIC_RESTART_COUNT"] = str(int(restart) + (int(own) if own.isdigit() else 0))
    local = env.get("LOCAL_RANK")
    if local is not None:
        env.setdefault("CLUSTERTOOL_LOCAL_RANK", local)
    stopper = Stopper()
    try:
        child = start_rank(program, sys.argv[1:], rank, program["out"], program["width"], env)
    except OSError as exc:
        sys.stderr.write(f"clustertool: rank {rank} on {host()}: cannot start {program.get('target')}: {exc}\n")
        record_exit(rank, 127, False)
        return 127
    stopper.children.append(child)
    status = wait(child)
    record_exit(rank, status, stopper.told is not None)
    return exit_status(status)


def wait(child):
    while True:
        try:
            return child.wait()
        except InterruptedError:
            continue


def decode_status(status):
    """os.wait's status as Popen.returncode says it: the code, or minus the signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def exit_status(status):
    """Our own exit for a child's status: its code, or 128+signal as a shell says it."""
    return status if status >= 0 else 128 - status


def failure_line(found):
    how = f"exited {found['code']}" if found.get("code") is not None else f"killed by signal {found.get('signal')}"
    last = found.get("tail") or []
    return f"rank {found['rank']} on {found['node']} {how}" + (f": {last[-1]}" if last else "")


def first_failure(out, width):
    """The first rank on this node that failed by itself (not told to stop), with its last stderr lines."""
    d = os.path.join(job_dir(), "exits")
    found = []
    for name in os.listdir(d) if os.path.isdir(d) else []:
        try:
            with open(os.path.join(d, name)) as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if rec.get("node") == host() and not rec.get("stopped") and (rec.get("code") or rec.get("signal")):
            found.append(rec)
    if not found:
        return None
    first = min(found, key=lambda r: r["time"])
    # a SIGKILL nobody of ours sent is the cause, not a consequence, even stamped up to 5 s after a peer
    # that failed of it (jobs/failure.py's earliest: the same rule across nodes)
    killed = [r for r in found if r.get("signal") == 9 and r["time"] - first["time"] <= 5.0]
    if killed:
        first = min(killed, key=lambda r: r["time"])
    first["tail"] = tail(rank_files(out, first["rank"], width)[1])
    return first


def report_failure(found, launcher_status=None):
    """Write ``failure`` and say it on stderr (mpirun carries it to the job's log)."""
    if found is None:
        found = {"rank": None, "node": host(), "code": launcher_status, "signal": None, "time": time.time(),
                 "tail": []}
        line = f"the launcher on {host()} exited {launcher_status} before any rank failed"
    else:
        line = failure_line(found)
    write_atomic(os.path.join(job_dir(), "failure"), json.dumps(found))
    sys.stderr.write(f"clustertool: {line}; stopping the job\n")
    sys.stderr.flush()


def stop_all(children, sig=signal.SIGTERM):
    for child in children:
        if child.poll() is None:
            try:
                child.send_signal(sig)
            except OSError:
                pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.05)
    for child in children:
        if child.poll() is None:
            child.kill()
            wait(child)


def child_env(plan, share, node_rank):
    """The launcher's (and so its ranks') environment: the job's, less MPI's, plus this node's place."""
    env = {k: v for k, v in os.environ.items() if k != NODE_ENV
           and not k.startswith(MPI_PREFIXES) and not (k.startswith("SLURM_") and k not in SLURM_KEPT)}
    nprocs = str(share["nprocs"])
    env.update({"NODE_RANK": str(node_rank), "CLUSTERTOOL_NODE_RANK": str(node_rank), "GROUP_RANK": str(node_rank),
                "LOCAL_WORLD_SIZE": nprocs, "CLUSTERTOOL_GPUS_PER_NODE": nprocs})
    if plan["launcher"] == "accelerate" and (plan.get("cpu") or not os.path.exists("/dev/nvidiactl")):
        env.setdefault("ACCELERATE_USE_CPU", "1")
    if plan["launcher"] == "deepspeed":
        for key, value in deepspeed_env(env).items():
            env.setdefault(key, value)
    return env


def deepspeed_env(env):
    """KEY=VALUE lines of .deepspeed_env (its name: DS_ENV_FILE) in the home folder, then the working
    folder, as DeepSpeed's ssh runner exports them (its per-node form without ssh reads none)."""
    name, found = env.get("DS_ENV_FILE", ".deepspeed_env"), {}
    for folder in (os.path.expanduser("~"), os.getcwd()):
        try:
            with open(os.path.join(folder, name)) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                found[key.strip()] = value.strip()
    return found


def run_processes(plan, share, env):
    """``process``: one rank per slot, started here; the first failure stops the others."""
    stopper = Stopper(kill_after=STOP_GRACE_S)
    out, width, program = plan["out"], plan["width"], plan["program"]
    children: dict = {}
    for local in range(share["nprocs"]):
        rank = share["first_rank"] + local
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(share["nprocs"]),
                     WORLD_SIZE=str(plan["world_size"]), CLUSTERTOOL_GPUS_PER_NODE=str(share["nprocs"]))
        try:
            child = start_rank(program, [], rank, out, width, env_r)
        except OSError as exc:
            sys.stderr.write(f"clustertool: rank {rank} on {host()}: cannot start {program['argv'][0]}: {exc}\n")
            record_exit(rank, 127, False)
            stop_all(list(children.values()))
            report_failure(first_failure(out, width))
            return 127
        children[child.pid] = (rank, child)
        stopper.children.append(child)
    if stopper.told is not None:  # told while they started
        for _, child in children.values():
            child.send_signal(stopper.told)
    failed = None
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid not in children:
            continue
        rank, child = children.pop(pid)
        child.returncode = decode_status(status)
        record_exit(rank, child.returncode, stopper.told is not None)
        if child.returncode != 0 and failed is None:
            failed = child.returncode
            if stopper.told is None:
                report_failure(first_failure(out, width))
            rest = list(children.values())
            stop_all([c for _, c in rest])
            for r, c in rest:
                record_exit(r, c.returncode, True)
            children.clear()
    if stopper.told is not None:
        return 128 + stopper.told
    return exit_status(failed) if failed is not None else 0


def run_launcher(plan, share, env):
    """torchrun / accelerate / deepspeed: this node's launcher, whose ranks run this file as their script."""
    stopper = Stopper(kill_after=STOP_GRACE_S)
    port, master = os.environ.get("MASTER_PORT", ""), os.environ.get("MASTER_ADDR", "")
    fill = {"{agent}": os.path.abspath(__file__), "{ds_hostfile}": os.path.join(job_dir(), "ds_hostfile")}
    if "hostfile" in plan:
        write_atomic(fill["{ds_hostfile}"], plan["hostfile"])
    elif "hostfile_slots" in plan:  # a Slurm job: its nodes are known now (their addresses, leader first)
        ips = os.environ.get("CLUSTERTOOL_NODE_IPS", "").split()
        lines = [f"{ip} slots={n}\n" for ip, n in zip(ips, plan["hostfile_slots"])]
        write_atomic(fill["{ds_hostfile}"], "".join(lines))
    argv = [fill.get(w, w).replace("{port}", port).replace("{master_addr}", master) for w in share["argv"]]
    program = dict(plan["program"], out=plan["out"], width=plan["width"])
    python = launcher_python(argv[0], env) if plan["launcher"] in NO_PYTHON else None
    if python and fill["{agent}"] in argv:  # this file runs as it is (#!: -I -S), the user's program under python
        at = argv.index(fill["{agent}"])
        argv = argv[:at] + [NO_PYTHON[plan["launcher"]]] + argv[at:]
        program["python"] = python
    env[PROGRAM_ENV] = json.dumps(program)
    warm = warm_plan(argv[0], env)
    child = warm_start(warm, argv, env) if warm else None
    if child is None:
        import subprocess

        try:
            child = Group(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                           preexec_fn=own_group))
        except OSError as exc:
            sys.stderr.write(f"clustertool: cannot start {argv[0]} on {host()}: {exc}\n")
            return 127
        if warm:  # the next job's start on this node skips the launcher's imports
            start_warm(warm)
    stopper.children.append(child)
    if stopper.told is not None:  # told while it started
        child.send_signal(stopper.told)
    err = Teardown(child.stderr, range(share["first_rank"], share["first_rank"] + share["nprocs"]),
                   os.path.basename(argv[0]))
    status = wait(child)
    if status != 0 and stopper.told is None:
        report_failure(first_failure(plan["out"], plan["width"]), status)
    child.clear()
    err.finish(status)
    if stopper.told is not None:
        return 128 + stopper.told
    return exit_status(status) if status else 0


class Teardown:
    """The launcher's stderr, passed on line by line, except what it writes once every rank on this node has
    ended well: held, and where the launcher then ends well too, kept in ``teardown.<host>`` and said in one
    line.  torchrun's exit barrier lives in node 0's launcher; where that one ends first, the others' barrier
    fails with c10d errors although the job succeeded (PyTorch's own race)."""

    def __init__(self, pipe, ranks, name):
        import threading

        self.pipe, self.ranks, self.name, self.held, self.done = pipe, list(ranks), name, [], False
        self.thread = threading.Thread(target=self.copy, daemon=True)
        self.thread.start()

    def ended_well(self):
        if not self.done:
            codes = []
            for rank in self.ranks:
                try:
                    with open(os.path.join(job_dir(), "exits", f"{host()}.{rank}")) as fh:
                        codes.append(json.load(fh).get("code"))
                except (OSError, ValueError):
                    return False
            self.done = all(code == 0 for code in codes)
        return self.done

    def copy(self):
        out = getattr(sys.stderr, "buffer", sys.stderr)
        for line in iter(self.pipe.readline, b""):
            if self.ended_well():
                self.held.append(line)
                continue
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass

    def finish(self, status):
        self.thread.join(5.0)
        if not self.held:
            return
        if status != 0:
            sys.stderr.write(b"".join(self.held).decode("utf-8", "replace"))
            return
        path = os.path.join(job_dir(), f"teardown.{host()}")
        with open(path, "ab") as fh:
            fh.writelines(self.held)
        sys.stderr.write(f"clustertool: {self.name} on {host()} wrote {len(self.held)} line(s) after every rank there "
                         f"had ended well, then ended well itself (its teardown; nothing lost): {path}\n")
        sys.stderr.flush()


def launcher_python(word, env):
    """The Python a launcher (``torchrun``, ``accelerate``, ``python3``) runs under: the word itself where it is a
    python, else the interpreter its #! line names; None where that is not plainly a python."""
    import shutil

    path = shutil.which(word, path=env.get("PATH")) or word
    if os.path.basename(path).startswith("python"):
        return path
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        words[:1] = [shutil.which(words[0], path=env.get("PATH")) or ""] if words else []
    if words and os.path.basename(words[0]).startswith("python") and len(words) == 1 and os.path.isabs(words[0]):
        return words[0]
    return None


def node_agent():
    if os.path.exists(os.path.join(job_dir(), "killed")):  # `kill` marked this node before the agent started
        return 143
    with open(os.path.join(job_dir(), "agent.json")) as fh:
        plan = json.load(fh)
    plan["out"] = os.path.expandvars(plan["out"])
    restart = os.environ.get(RESTART_ENV, "")
    if restart.isdigit() and int(restart) > 0:
        plan["out"] = begin_attempt(plan["out"], int(restart))
    node_rank = int(os.environ.get(NODE_ENV) or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID")
                    or "0")
    if NODE_ENV in os.environ:
        stop_on_hangup()
    share = plan["nodes"][node_rank]
    env = child_env(plan, share, node_rank)
    if plan["launcher"] == "process":
        return run_processes(plan, share, env)
    return run_launcher(plan, share, env)


def stop_on_hangup():
    """Started by fan.py: our stdin is the leader's end.  Its close (the job stopped there, or the link to the
    leader gone) stops this node's part as SIGTERM does (the Stopper passes it on to the launcher or ranks)."""
    import threading

    def watch():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


def begin_attempt(out, k):
    """Attempt ``k`` (>= 1) of a job run with --restarts: the last attempt's ``failure`` and rank exits here
    are set aside (they would be taken for this one's); its ranks write to ``OUT/attempt.k``."""
    keep = os.path.join(job_dir(), "attempts", str(k - 1))
    os.makedirs(keep, exist_ok=True)
    try:
        os.replace(os.path.join(job_dir(), "failure"), os.path.join(keep, "failure"))
    except OSError:
        pass
    exits = os.path.join(job_dir(), "exits")
    for name in os.listdir(exits) if os.path.isdir(exits) else []:
        if name.startswith(host() + "."):
            try:
                os.unlink(os.path.join(exits, name))
            except OSError:
                pass
    return f"{out}/attempt.{k}"


def main():
    if PROGRAM_ENV in os.environ:
        return rank_runner()
    return node_agent()


if __name__ == "__main__":
    sys.exit(main())
