"""Autostop watcher: runs on the cluster's leader and stops (or terminates) an idle cluster.

Installed by ``clustertool up --autostop`` / ``clustertool autostop`` into
``~/.clustertool/autostop/`` and run every interval (``tick``: a systemd timer) or by a
supervised loop (``loop``, where systemd does not run).  Standard library only, no clustertool
import: the leader runs it with its own python3.

Each sample looks at the clustertool jobs on the leader (its job folders, as ``job_status.sh``
reads them), at GPU utilisation on every node (``nvidia-smi`` over the cluster's own SSH mesh;
a node without it counts jobs only) and, with ``wait_for: jobs-and-ssh``, at interactive SSH
sessions (an ``sshd`` session process with a pty).  Once the cluster has been idle for
``idle_s`` seconds it logs why and powers off the members, then the leader.

Files (``DIR``): config.json (written by clustertool), state.json (idle since, last sample),
autostop.log (one line per decision), poweroff.json (what was done, when and why).

The same watcher warns jobs before the machines are taken back (a Capacity Block's end, or the
end ``clustertool capacity block-end`` set): config.json's ``block_end`` is ``{"at": epoch when the
machines go, "warning_s", "signal", "source"}``.  From ``at - warning_s`` on, every running job's
ranks get ``signal`` on every node of the job (once per job), the job's folder gets ``blockend``
(JSON: when, signal, ranks per node; `jobs` shows it) and the log a line; blockend.json keeps
which jobs were signalled.  This runs whether or not autostop is set.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

DIR = os.path.join(os.path.expanduser("~"), ".clustertool", "autostop")
JOBS = os.path.join(os.path.expanduser("~"), ".clustertool", "jobs")
JOB_ENV = "CLUSTERTOOL_JOB"
PENDING_S = 30.0  # a job folder without launch.pid this young is a job being started
GPU_BUSY_PERCENT = 5.0
# nvidia-smi on PATH; ~/.local/bin first (a user's own tools), then the NVIDIA driver's folders
PROBE = """PATH="$HOME/.local/bin:$PATH:/usr/local/nvidia/bin:/usr/lib/wsl/lib"
if command -v nvidia-smi >/dev/null 2>&1; then
  if u=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null); then
    echo "gpu $(echo $u)"
  else
    echo "gpu error"
  fi
else
  echo "gpu none"
fi
echo "ssh $(ps -eo args= 2>/dev/null | grep -c -E '^sshd(-session)?: [^ ]+@pts/')"
"""
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5",
       "-o", "ServerAliveCountMax=2"]


def _path(name):
    return os.path.join(DIR, name)


def read_json(name, default=None):
    try:
        with open(_path(name)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def write_json(name, data):
    tmp = _path(name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
    os.replace(tmp, _path(name))


def log(line, now=None):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now or time.time()))
    with open(_path("autostop.log"), "a") as fh:
        fh.write("%s %s\n" % (stamp, line))


# ---- what is running ---------------------------------------------------------------------

def running_jobs(jobs_dir=JOBS, now=None):
    """Ids of the clustertool jobs running (or being started) on this node."""
    now = time.time() if now is None else now
    found: list = []
    try:
        names = sorted(os.listdir(jobs_dir))
    except OSError:
        return found
    for name in names:
        d = os.path.join(jobs_dir, name)
        if not os.path.isfile(os.path.join(d, "job.json")) or os.path.exists(os.path.join(d, "exit")):
            continue
        try:
            with open(os.path.join(d, "launch.pid")) as fh:
                pid = fh.read().split()[0]
        except (OSError, IndexError):
            if now - os.path.getmtime(os.path.join(d, "job.json")) < PENDING_S:
                found.append(name)
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if ("%s=%s" % (JOB_ENV, name)).encode() in env:
            found.append(name)
    return found


def parse_probe(text):
    """{"gpus": [percent, ...] | None (no nvidia-smi) | "error", "ssh": sessions} from PROBE's output."""
    out: dict = {"gpus": None, "ssh": 0}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key == "gpu":
            if rest.strip() == "none":
                out["gpus"] = None
            elif rest.strip() == "error":
                out["gpus"] = "error"
            else:
                out["gpus"] = [float(v) for v in re.findall(r"[0-9]+(?:\.[0-9]+)?", rest)]
        elif key == "ssh" and rest.strip().isdigit():
            out["ssh"] = int(rest.strip())
    return out


def probe_nodes(config, timeout=30.0):
    """Run PROBE on the leader and (over ssh, in parallel) on every member: {node: probe | None}."""
    procs = {config.get("leader", "leader"): subprocess.Popen(
        ["sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)}
    for member in config.get("members", []):
        procs[member["name"]] = subprocess.Popen(
            SSH + [member["address"], "sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
    out: dict = {}
    for name, proc in procs.items():
        try:
            stdout, _ = proc.communicate(PROBE.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[name] = None
            continue
        out[name] = parse_probe(stdout.decode(errors="replace")) if proc.returncode == 0 else None
    return out


# ---- the decision ------------------------------------------------------------------------

def busy_reasons(config, jobs, probes):
    """Why the cluster is busy now (empty: idle), and notes (unreachable nodes, GPU errors)."""
    reasons, notes = [], []
    if jobs:
        reasons.append("job(s) running: %s" % ", ".join(jobs))
    for node in sorted(probes):
        probe = probes[node]
        if probe is None:
            notes.append("%s unreachable" % node)
            continue
        gpus = probe["gpus"]
        if gpus == "error":
            notes.append("%s: nvidia-smi failed" % node)
        elif gpus and max(gpus) >= GPU_BUSY_PERCENT:
            reasons.append("%s GPU busy (%s%%)" % (node, "/".join("%g" % g for g in gpus)))
        if config.get("wait_for") == "jobs-and-ssh" and probe["ssh"]:
            reasons.append("%s: %d interactive ssh session(s)" % (node, probe["ssh"]))
    return reasons, notes


def decide(config, state, reasons, now, boot=0.0):
    """The new state and the action: None, "stop" or "down".

    The idle clock starts at the first idle sample; a busy sample, a new setting (``set_at``) or a
    boot after the clock started (a `start` after an autostop) starts it again."""
    idle_s = config.get("idle_s")
    state = dict(state or {})
    state["checked"] = now
    state["busy"] = reasons
    since = state.get("idle_since")
    if not idle_s or reasons:
        state["idle_since"] = None
        return state, None
    if since is None or since < config.get("set_at", 0) or since < boot:
        since = now
    state["idle_since"] = since
    if now - since >= idle_s:
        return state, "down" if config.get("down") else "stop"
    return state, None


def boot_time():
    """When this machine (its PID 1: a local node's init too) started, as an epoch."""
    try:
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        with open("/proc/1/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return 0.0


# ---- acting ------------------------------------------------------------------------------

def power_off(config, action, why, now):
    """Members first (in parallel, over ssh), then this node; poweroff.json says what and why."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once begun, a power-off is not left half done
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    members = config.get("members", [])
    what = "terminating" if action == "down" else "stopping"
    log("%s the cluster: %s; members %s, then the leader" % (
        what, why, ", ".join(m["name"] for m in members) or "(none)"), now)
    write_json("poweroff.json", {"t": now, "action": action, "why": why})
    command = config["poweroff"]
    procs = [(m["name"], subprocess.Popen(SSH + [m["address"], command], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)) for m in members]
    for name, proc in procs:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        log("%s: power-off sent (ssh exit %s)" % (name, proc.returncode))
    log("leader: powering off")
    subprocess.call(["sh", "-c", command])


# Every rank of the job on this node (ranks/<host>.<rank>: the rank's pid after its wrapper's exec, checked
# against the job's marker in its environment), signaled; prints the pids.
SIGNAL_RANKS = r"""
d="$HOME/.clustertool/jobs/$1"
for f in "$d/ranks/$(uname -n)".*; do
  [ -f "$f" ] || continue
  read -r p _ < "$f"
  grep -q -a -z -x "CLUSTERTOOL_JOB=$1" "/proc/$p/environ" 2>/dev/null && kill "-$2" "$p" 2>/dev/null && echo "$p"
done
true
"""


def job_nodes(job, config, jobs_dir=JOBS):
    """[(name, address or None for this node)] of the job's nodes (all the cluster's when unknown)."""
    leader = config.get("leader", "leader")
    members = {m["name"]: m["address"] for m in config.get("members", [])}
    try:
        with open(os.path.join(jobs_dir, job, "job.json")) as fh:
            names = json.load(fh).get("nodes") or []
    except (OSError, ValueError):
        names = []
    names = names or [leader] + list(members)
    return [(n, None if n == leader else members.get(n)) for n in names if n == leader or n in members]


def signal_job(job, sig, nodes):
    """Send ``sig`` to the job's ranks on each node (here, or over ssh); {node: pids signalled}."""
    procs = {}
    for name, address in nodes:
        argv = ["sh", "-s", job, sig] if address is None else SSH + [address, "sh -s %s %s" % (job, sig)]
        procs[name] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    done = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(SIGNAL_RANKS.encode(), timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        done[name] = [int(w) for w in out.decode(errors="replace").split() if w.isdigit()]
    return done


def block_end_due(block, now):
    """Whether jobs are to be warned now: from ``at - warning_s`` on."""
    return bool(block and block.get("at")) and now >= float(block["at"]) - float(block.get("warning_s") or 0)


def block_end_tick(config, now, jobs_dir=JOBS):
    """Warn the running jobs once each when the block's end is near; returns the jobs signalled now."""
    block = config.get("block_end")
    if not block_end_due(block, now):
        return []
    at, sig = float(block["at"]), str(block.get("signal") or "TERM")
    done = read_json("blockend.json", {})
    if done.get("at") != at:  # a new end time: nothing was signalled for it yet
        done = {"at": at, "jobs": {}}
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    if not done.get("opened"):
        done["opened"] = now
        log("block end: %s; the machines go at %s: warning running jobs with SIG%s" % (
            block.get("source") or "the end", when, sig), now)
    acted = []
    for job in running_jobs(jobs_dir, now):
        if job in done["jobs"]:
            continue
        ranks = signal_job(job, sig, job_nodes(job, config, jobs_dir))
        count = sum(len(p) for p in ranks.values())
        if not count:
            continue  # its ranks have not started yet: the next sample tries again
        record = {"t": now, "signal": sig, "at": at, "source": block.get("source") or "", "ranks": ranks}
        with open(os.path.join(jobs_dir, job, "blockend"), "w") as fh:
            json.dump(record, fh, sort_keys=True)
        done["jobs"][job] = record
        acted.append(job)
        log("block end: signalled %s to job %s (%d rank(s) on %s): the machines go at %s" % (
            sig, job, count, ", ".join(sorted(n for n, p in ranks.items() if p)), when), now)
    done["checked"] = now
    write_json("blockend.json", done)
    return acted


def describe_idle(state, now):
    since = state.get("idle_since")
    return "idle %ds" % (now - since) if since is not None else "busy"


def tick(now=None):
    config = read_json("config.json")
    if not config:
        return None
    now = time.time() if now is None else now
    try:
        block_end_tick(config, now)
    except Exception as exc:  # the idle decision still runs
        log("block end check failed: %s: %s" % (type(exc).__name__, exc), now)
    if not config.get("idle_s"):
        write_json("state.json", {"checked": now, "idle_since": None, "busy": [], "cancelled": True})
        return None
    boot = boot_time()
    done = read_json("poweroff.json")
    if done and done.get("t", 0) < boot:  # powered off before this boot: a `start` since
        os.unlink(_path("poweroff.json"))
    jobs = running_jobs()
    probes = probe_nodes(config)
    reasons, notes = busy_reasons(config, jobs, probes)
    old = read_json("state.json", {})
    state, action = decide(config, old, reasons, now, boot)
    state["notes"] = notes
    write_json("state.json", state)
    if not old or bool(old.get("busy")) != bool(reasons) or notes != old.get("notes", []):
        log("%s%s" % ("; ".join(reasons) or "idle", (" (%s)" % "; ".join(notes)) if notes else ""), now)
    if action:
        why = "idle for %ds (no jobs%s%s)" % (
            now - state["idle_since"], ", GPUs under %g%%" % GPU_BUSY_PERCENT,
            ", no interactive ssh" if config.get("wait_for") == "jobs-and-ssh" else "")
        power_off(config, action, why, now)
    return action


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def loop():
    """Sample every interval; a new config.json is sampled at once, a new program ends the loop
    between samples (its supervisor, run.sh, starts the new one)."""
    me = os.path.abspath(__file__)
    started = _mtime(me)
    while True:
        seen = _mtime(_path("config.json"))
        try:
            tick()
        except Exception as exc:  # the watcher must outlive one bad sample
            log("sample failed: %s: %s" % (type(exc).__name__, exc))
        config = read_json("config.json", {})
        deadline = time.time() + max(1.0, float(config.get("interval_s") or 60))
        while time.time() < deadline and _mtime(_path("config.json")) == seen:
            time.sleep(0.25)
        if _mtime(me) != started:
            return


def _name_process():
    """Call this process ct-autostop, so doctor's stray python check and `kill --all-python` (which
    match command names) leave clustertool's own watcher alone."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"ct-autostop", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _name_process()
    mode = sys.argv[1] if len(sys.argv) > 1 else "tick"
    if mode == "loop":
        loop()
    else:
        tick()
