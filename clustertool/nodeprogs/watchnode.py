"""The node side of `clustertool top` and the monitoring recorder (stdlib only): one sample per ask.

The leader's hub (watchhub.py) starts this program on every node (itself for the leader, over the
cluster's own ssh for the others; one connection each for as long as it watches).  The hub writes
one JSON line per reading on stdin, ``{"seq": N, "jobs": [{"id", "out"}...]}``; this program answers
with one JSON line: the node's CPU, memory, network, disk and GPUs, and per watched job the ranks
whose output is on this node (their last output age and the steps parsed from their lines).  It
ends when stdin closes.  ``ARGS`` (prepended): ``node`` (its name), ``regex`` (metric regexes, see
watchsteps.py, the part that comes first), ``gpu`` (false: no nvidia-smi), ``gpu_ms`` (nvidia-smi's
own loop interval).

CPU and memory: the machine's (/proc/stat, /proc/meminfo); on a node of the local provider (PID 1 is
``ct-init``), which shares this machine's CPUs, the node's own processes' instead.  Network: bytes of
every interface but loopback and virtual ones (/proc/net/dev).  GPUs: one ``nvidia-smi --query-gpu
... -lms`` running in loop mode for the program's life (one NVML start, not one per reading).
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

if "RankSteps" not in globals():  # imported (tests, the control side); on a node the part comes first
    from clustertool.nodeprogs.watchsteps import RankSteps, compile_patterns

GPU_FIELDS = ("index", "utilization.gpu", "memory.used", "memory.total", "power.draw", "power.limit",
              "temperature.gpu", "clocks.sm")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer drivers, older
# The bits of clocks_event_reasons.active (NVML's nvmlClocksEventReason* constants)
REASON_BITS = ((0x1, "idle"), (0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
               (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake"),
               (0x100, "display_clocks"))
SMI_PATH = "{home}/.local/bin:{path}:/usr/local/nvidia/bin:/usr/lib/wsl/lib"
VIRTUAL_IFACES = re.compile(r"^(lo|docker\d*|veth.*|br-.*|virbr.*|ctbr.*|cni.*|flannel.*|tun.*|tap.*)$")
TAIL_BYTES = 64 << 10  # what is read of a rank's file already there when first seen (its recent steps)
STREAMS = ("stdout", "stderr")


# ---- the machine ---------------------------------------------------------------------------

def read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def cpu_jiffies(stat_text):
    """(busy, total) jiffies from /proc/stat's first line."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)
            total = sum(v[:8])
            return total - idle, total
    return 0, 0


def meminfo(text):
    """(used, total) bytes from /proc/meminfo (used: total less MemAvailable)."""
    kb = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key] = int(parts[0]) * 1024
    total = kb.get("MemTotal", 0)
    return total - kb.get("MemAvailable", kb.get("MemFree", 0)), total


def net_bytes(text):
    """{interface: (rx bytes, tx bytes)} from /proc/net/dev, loopback and virtual interfaces left out."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        name, fields = name.strip(), rest.split()
        if name and len(fields) >= 9 and not VIRTUAL_IFACES.match(name):
            out[name] = (int(fields[0]), int(fields[8]))
    return out


def link_speed_bps(ifaces):
    """The sum of the interfaces' speed (bits/s) where the kernel knows it for a real device, else None."""
    total = 0
    for name in ifaces:
        if not os.path.exists(f"/sys/class/net/{name}/device"):
            continue  # a veth or other virtual link: its "speed" is made up
        text = read(f"/sys/class/net/{name}/speed").strip()
        if text.lstrip("-").isdigit() and int(text) > 0:
            total += int(text) * 1_000_000
    return total or None


def own_processes_usage():
    """(CPU seconds, resident bytes) of every process this /proc shows (a local node's PID namespace)."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = read(f"/proc/{entry}/stat").rsplit(")", 1)[-1].split()
        if len(fields) > 22:
            cpu += int(fields[11]) + int(fields[12])
            rss += int(fields[21]) * page
    return cpu / tick, rss


def disk(path):
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"path": path, "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}


# ---- GPUs: nvidia-smi in its own loop --------------------------------------------------------

def gpu_number(text):
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]


def reasons(mask_text):
    try:
        mask = int(mask_text.strip(), 16)
    except ValueError:
        return None
    return [name for bit, name in REASON_BITS if mask & bit]


def parse_gpu_line(line):
    """One line of ``--query-gpu=GPU_FIELDS,<reasons> --format=csv,noheader,nounits``, or None."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(GPU_FIELDS) + 1 or not parts[0].isdigit():
        return None
    v = [gpu_number(p) for p in parts[1:-1]]
    return {"index": int(parts[0]), "util": v[0], "mem_used": None if v[1] is None else v[1] * 2**20,
            "mem_total": None if v[2] is None else v[2] * 2**20, "power": v[3], "power_limit": v[4],
            "temp": v[5], "sm_clock": v[6], "reasons": reasons(parts[-1])}


def smi_argv(reason_field, interval_ms):
    fields = ",".join(GPU_FIELDS + (reason_field,))
    return ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"--loop-ms={int(interval_ms)}"]


class Gpus:
    """The latest complete batch of nvidia-smi's loop: a list per GPU, None (no nvidia-smi) or 'error: ...'."""

    def __init__(self, interval_ms):
        self.interval_ms, self.proc, self.state = interval_ms, None, None
        self.batch, self.latest, self.lock = [], None, threading.Lock()
        env = dict(os.environ, PATH=SMI_PATH.format(home=os.path.expanduser("~"), path=os.environ.get("PATH", "")))
        self.env = env
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        for field in REASON_FIELDS:
            try:
                self.proc = subprocess.Popen(smi_argv(field, self.interval_ms), stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=self.env)
            except OSError:
                self.state = "none"
                return
            out, errs = self.proc.stdout, self.proc.stderr
            assert out is not None and errs is not None  # spawned with pipes
            for raw in out:
                self.take(raw.decode("utf-8", "replace"))
            err = errs.read().decode("utf-8", "replace").strip()
            self.proc.wait()
            if "is not a valid field" not in err or field == REASON_FIELDS[-1]:
                last = err.splitlines()[-1][:160] if err else f"nvidia-smi exited {self.proc.returncode}"
                self.state = "error: " + last
                return

    def take(self, line):
        gpu = parse_gpu_line(line)
        if gpu is None:
            return
        with self.lock:
            if self.batch and gpu["index"] <= self.batch[-1]["index"]:
                self.latest, self.batch = self.batch, []
            self.batch.append(gpu)
            self.state = "ok"

    def snapshot(self):
        with self.lock:
            if self.state == "ok":
                return self.latest or list(self.batch)
        if self.state is None:
            return "starting"
        return None if self.state == "none" else self.state

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


# ---- ranks' output ---------------------------------------------------------------------------

def expand(path):
    return os.path.join(os.path.expanduser("~"), path[6:]) if path.startswith("$HOME/") else os.path.expanduser(path)


def rank_files(out):
    """{rank: [paths of its stdout/stderr]} of the latest attempt that wrote each rank's output under ``out``."""
    found: dict = {}
    try:
        tops = os.listdir(out)
    except OSError:
        return {}
    for top in tops:
        attempt = int(top.split(".", 1)[1]) if top.startswith("attempt.") and top[8:].isdigit() else 0
        base = os.path.join(out, top) if attempt else out
        job_dirs = [top] if not attempt else _listdir(base)
        for job_dir in job_dirs:
            for rank_dir in _listdir(os.path.join(base, job_dir)):
                if rank_dir.startswith("rank.") and rank_dir[5:].isdigit():
                    rank = int(rank_dir[5:])
                    if rank not in found or found[rank][0] < attempt:
                        folder = os.path.join(base, job_dir, rank_dir)
                        found[rank] = (attempt, [os.path.join(folder, s) for s in STREAMS])
    return {rank: paths for rank, (_, paths) in found.items()}


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


class Tail:
    """New whole lines of one file since the last read (a file made anew starts over)."""

    def __init__(self, path):
        self.path, self.pos, self.inode, self.held, self.mtime = path, None, None, b"", 0.0

    def lines(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        self.mtime = st.st_mtime
        if self.pos is None or st.st_ino != self.inode or st.st_size < self.pos:
            self.pos = max(0, st.st_size - TAIL_BYTES) if self.pos is None else 0
            self.inode, self.held = st.st_ino, b""
        if st.st_size <= self.pos:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            data = fh.read(st.st_size - self.pos)
        self.pos += len(data)
        parts = re.split(rb"[\r\n]", self.held + data)
        self.held = parts.pop()[-4096:]
        return [p.decode("utf-8", "replace") for p in parts if p]


class Job:
    """One watched job's ranks on this node, and its reducers' lateness records where this node is a server."""

    def __init__(self, job_id, out, patterns):
        self.id, self.out, self.patterns = job_id, expand(out), patterns
        self.ranks, self.tails, self.late = {}, {}, {}

    def lateness(self):
        """{file: its last line} of the job's ``stragglers/*.jsonl`` here (watchlate.py says what they hold)."""
        folder = os.path.join(os.path.dirname(self.out), "stragglers")
        for name in _listdir(folder):
            if name.endswith(".jsonl") and name not in self.late:
                self.late[name] = [Tail(os.path.join(folder, name)), None]
        out = {}
        for name, entry in self.late.items():
            for line in entry[0].lines():
                try:
                    entry[1] = json.loads(line)
                except ValueError:
                    continue
            if entry[1] is not None:
                out[name] = entry[1]
        return out

    def sample(self, now):
        for rank, paths in rank_files(self.out).items():
            if rank not in self.ranks or [t.path for t in self.tails[rank]] != paths:
                self.ranks[rank], self.tails[rank] = RankSteps(), [Tail(p) for p in paths]
        out = {}
        for rank, steps in self.ranks.items():
            for tail in self.tails[rank]:
                seen_at = None if tail.pos is None else now  # what was there before watching: no arrival time
                for line in tail.lines():
                    steps.feed(line, seen_at, self.patterns)
            last = max(t.mtime for t in self.tails[rank])
            out[str(rank)] = dict(steps.summary(now), age=round(max(0.0, time.time() - last), 1) if last else None,
                                  ended=self.ended(rank))
        return out

    def ended(self, rank):
        """The rank's wrapper recorded how it ended (exits/<host>.<rank> in the job's folder; not under plain
        mpirun, whose ranks have no wrapper)."""
        return os.path.exists(os.path.join(os.path.dirname(self.out), "exits", "%s.%d" % (os.uname().nodename, rank)))


# ---- the sampler -----------------------------------------------------------------------------

class Sampler:
    def __init__(self, args):
        self.args = args
        self.patterns = compile_patterns(args.get("regex") or [])
        self.local_node = read("/proc/1/comm").strip() == "ct-init"
        self.gpus = Gpus(args.get("gpu_ms", 1000)) if args.get("gpu", True) else None
        self.jobs = {}
        self.prev = self.counters()  # the first answer has rates already (over the time since the start)

    def counters(self):
        ifaces = net_bytes(read("/proc/net/dev"))
        if self.local_node:
            cpu_s, rss = own_processes_usage()
            used, total = rss, meminfo(read("/proc/meminfo"))[1]
            busy, cap = cpu_s, None
        else:
            busy, cap = cpu_jiffies(read("/proc/stat"))
            used, total = meminfo(read("/proc/meminfo"))
        return {"t": time.monotonic(), "busy": busy, "cap": cap, "mem": (used, total), "ifaces": ifaces,
                "self": sum(os.times()[:4])}

    def machine(self, cur):
        prev, out = self.prev, {"ncpu": os.cpu_count(), "mem_used": cur["mem"][0], "mem_total": cur["mem"][1],
                                "cpu": None, "rx": None, "tx": None, "self_cpu_s": round(cur["self"], 3),
                                "ifaces": sorted(cur["ifaces"]), "link_bps": link_speed_bps(cur["ifaces"]),
                                "cpu_of": "node processes" if self.local_node else "machine"}
        if prev is not None and cur["t"] > prev["t"]:
            dt = cur["t"] - prev["t"]
            if cur["cap"] is None:
                out["cpu"] = round(max(0.0, 100.0 * (cur["busy"] - prev["busy"]) / dt / (os.cpu_count() or 1)), 1)
            elif cur["cap"] > prev["cap"]:
                out["cpu"] = round(100.0 * (cur["busy"] - prev["busy"]) / (cur["cap"] - prev["cap"]), 1)
            both = [n for n in cur["ifaces"] if n in prev["ifaces"]]
            out["rx"] = round(sum(cur["ifaces"][n][0] - prev["ifaces"][n][0] for n in both) / dt)
            out["tx"] = round(sum(cur["ifaces"][n][1] - prev["ifaces"][n][1] for n in both) / dt)
        return out

    def watch_jobs(self, wanted):
        ids = {j["id"] for j in wanted}
        for job_id in [j for j in self.jobs if j not in ids]:
            del self.jobs[job_id]
        for job in wanted:
            if job["id"] not in self.jobs:
                self.jobs[job["id"]] = Job(job["id"], job["out"], self.patterns)

    def sample(self, request):
        self.watch_jobs(request.get("jobs") or [])
        cur, now = self.counters(), time.monotonic()
        out = self.machine(cur)
        self.prev = cur
        first = sorted(self.jobs)[0] if self.jobs else None
        where = os.path.dirname(self.jobs[first].out) if first else os.path.expanduser("~")
        out.update({"node": self.args.get("node"), "seq": request.get("seq"), "time": time.time(),
                    "disk": disk(where if os.path.isdir(where) else os.path.expanduser("~")),
                    "gpus": self.gpus.snapshot() if self.gpus else None,
                    "jobs": {job_id: job.sample(now) for job_id, job in self.jobs.items()}})
        late = {job_id: job.lateness() for job_id, job in self.jobs.items()}
        out["stragglers"] = {job_id: files for job_id, files in late.items() if files}
        return out


def name_process():
    """``ct-watchnode`` in ps and top, not python."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"ct-watchnode", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main(args):
    name_process()
    sampler = Sampler(args)
    try:
        for raw in sys.stdin.buffer:
            try:
                request = json.loads(raw)
            except ValueError:
                continue
            sys.stdout.write(json.dumps(sampler.sample(request), separators=(",", ":")) + "\n")
            sys.stdout.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        if sampler.gpus:
            sampler.gpus.close()


ARGS: dict  # prepended by the hub; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "node" in ARGS:  # noqa: F821  (prepended)
    main(ARGS)  # noqa: F821
