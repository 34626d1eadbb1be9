#!/usr/bin/env -S python3 -I -S
"""The node launchers' start on the leader, in mpirun's place (stdlib only; never imports clustertool).

A torchrun, accelerate, deepspeed or ``process`` job runs one job agent (jobagent.py) per node.  This program
starts them all at once, as ``pdsh`` would: the leader's own agent here, every other node's over ssh (the
nodes' ~/.ssh/config: the cluster key, pinned host keys), through a connection to that node it keeps open for
the next job (``ControlMaster``/``ControlPersist``: the next job's start needs no handshake).  It then holds
the job together as mpirun held it:

* each agent's output (its launcher's own lines) comes here, into the job's log;
* the first agent that fails (its rank or its launcher failed, or its node could not be reached) stops the
  job: every other agent's stdin is closed, which that agent takes as SIGTERM (it stops its ranks and
  exits); after ``GRACE_S`` the connections still open are cut;
* SIGTERM/SIGINT/SIGHUP here (`kill`, the supervisor for a lost node, a hang) stop the job the same way;
* its exit is the first failed agent's (0 when every agent ended well; 128+signal when told to stop).

Its command line is mpirun's shape, so the restart loop and a readdressed node treat it alike::

    fan.py -H ADDR[:PORT],ADDR[:PORT],... [-wdir DIR] [-x NAME=VALUE | -x NAME]... [-free-port NAME]

The first address is the leader (node rank 0, this machine); node rank k is the k-th address.  ``-x NAME``
passes this process's own value of NAME; ``-free-port NAME``: NAME is a port free here now (the launchers'
MASTER_PORT: picked as they start, so no node runs a python3 before to ask).  Each agent gets
``CLUSTERTOOL_AGENT_NODE=k`` (its node rank).
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

JOB_ENV = "CLUSTERTOOL_JOB"
NODE_ENV = "CLUSTERTOOL_AGENT_NODE"
JOBS_DIR = ".clustertool/jobs"  # the job's folder on every node, relative to the home (this file is in it)
LOST_PROBE_S = 2.0  # how long a node's sshd may take to accept a connection before the node counts as lost
GRACE_S = 4.0  # the supervisor's own grace is 5 s: we are gone before it kills us
# A connection kept for the next job; one that stops answering ends within ~6 s (a lost or replaced node).
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", "ControlPath=~/.ssh/ct-fan-%C",
               "-o", "ControlPersist=10m", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")


def parse(argv):
    """(hosts [(address, port or None)], workdir or None, env items, names of free ports)."""
    hosts, workdir, items, free, i = [], None, [], [], 0
    while i < len(argv):
        word, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if value is None:
            raise SystemExit(f"fan.py: {word} needs a value")
        if word == "-H":
            for entry in value.split(","):
                addr, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
                hosts.append((addr, port or None))
        elif word == "-wdir":
            workdir = value
        elif word == "-x":
            items.append(value)
        elif word == "-free-port":
            free.append(value)
        else:
            raise SystemExit(f"fan.py: unknown option {word}")
        i += 2
    return hosts, workdir, items, free


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def env_of(items, environ):
    """NAME -> VALUE for the agents: ``-x NAME=VALUE`` as given, ``-x NAME`` from ``environ`` (skipped if unset)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if eq:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
    return out


def agent_line(env, workdir, node_rank, job_id):
    """The remote command for node rank ``node_rank``: its agent, with the job's environment (``env``'s PATH
    also finds the python3 it runs under: ``-I -S``, the agent needs no site)."""
    words = [f"{k}={v}" for k, v in env.items()] + [f"{NODE_ENV}={node_rank}"]
    cd = f"cd {shlex.quote(workdir)} && " if workdir else ""
    agent = f'"$HOME"/{shlex.quote(f"{JOBS_DIR}/{job_id}/jobagent.py")}'
    return f"{cd}exec env {shlex.join(words)} python3 -I -S {agent}"


def ssh_argv(addr, port, line):
    return ["ssh", *SSH_OPTIONS, *(["-p", port] if port else []), addr, line]


def die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Fan:
    def __init__(self, hosts, workdir, items, free=()):
        self.env = env_of(items, os.environ)
        self.env.update({name: str(free_port()) for name in free})
        self.hosts, self.workdir = hosts, workdir
        self.procs = []  # (address, Popen)
        self.ended = []  # (address, returncode) in the order they ended
        self.cond = threading.Condition()
        self.told = None
        self.stop_at = None
        self.expected = 0  # agents started, or that failed to start

    def start(self):
        # ssh and the connection it may leave for the next job carry no job mark (they are no process of the
        # job for preflight, doctor or kill); the agents get it in their command line
        quiet = {k: v for k, v in os.environ.items() if k != JOB_ENV}
        job_id = self.env.get(JOB_ENV) or os.environ.get(JOB_ENV, "")
        for k, (addr, port) in enumerate(self.hosts):
            with self.cond:
                if self.stop_at is not None:  # told to stop, or an agent failed already: start no more
                    break
                self.expected += 1
            if k == 0:  # the leader: this machine (its agent beside this file)
                argv = ["python3", "-I", "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobagent.py")]
                env = dict(os.environ, **self.env, **{NODE_ENV: "0"})
            else:
                argv, env = ssh_argv(addr, port, agent_line(self.env, self.workdir, k, job_id)), quiet
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env, preexec_fn=die_with_parent)
            except OSError as exc:
                sys.stderr.write(f"clustertool: cannot start the job agent for {addr}: {exc}; stopping the job\n")
                self.finished(addr, 127)
                continue
            with self.cond:
                self.procs.append((addr, proc))
                if self.stop_at is not None:
                    proc.stdin.close()
            threading.Thread(target=self.wait_one, args=(addr, proc), daemon=True).start()

    def wait_one(self, addr, proc):
        self.finished(addr, proc.wait())

    def finished(self, addr, code):
        with self.cond:
            first = code != 0 and self.stop_at is None and self.told is None
        if first and code == 255:  # before the others stop: its lost record comes first
            self.lost(addr)
        with self.cond:
            self.ended.append((addr, code))
            if code != 0:
                self.abort()
            self.cond.notify_all()

    def lost(self, addr):
        """ssh to ``addr`` failed (exit 255: its agent did not run, or the link broke).  Where its sshd does not
        answer either, the node is lost: ``lost`` in the job's folder says so (jobs/failure.py reads it, as
        it reads the supervisor's)."""
        port = dict(self.hosts).get(addr) or 22
        try:
            socket.create_connection((addr, int(port)), timeout=LOST_PROBE_S).close()
            gone = False
        except OSError:
            gone = True
        why = "stopped answering" if gone else "could not be reached by ssh"
        if gone:
            doc = {"kind": "lost", "address": addr, "time": time.time(), "what": f"{why} (the job's ssh to it)"}
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lost")
            try:
                with open(path + ".tmp", "w") as fh:
                    json.dump(doc, fh)
                os.replace(path + ".tmp", path)
            except OSError:
                pass
        sys.stderr.write(f"clustertool: {addr} {why} (ssh exit 255); stopping the job\n")
        sys.stderr.flush()

    def abort(self):
        """Every agent still running: its stdin closed (it stops its ranks and exits)."""
        if self.stop_at is None:
            self.stop_at = time.monotonic() + GRACE_S
        for _, proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def on_signal(self, sig, _frame):
        if self.told is None:
            self.told = sig
        with self.cond:
            self.abort()
            self.cond.notify_all()

    def wait(self):
        with self.cond:
            while len(self.ended) < self.expected:
                if self.stop_at is not None and time.monotonic() >= self.stop_at:
                    for _, proc in self.procs:
                        if proc.poll() is None:
                            proc.kill()
                    self.stop_at = float("inf")
                self.cond.wait(None if self.stop_at is None else max(0.05, min(1.0, self.stop_at - time.monotonic())))
        if self.told is not None:
            return 128 + self.told
        failed = [code for _, code in self.ended if code != 0]
        if not failed:
            return 0
        code = failed[0]
        return code if code >= 0 else 128 - code


def main(argv):
    hosts, workdir, items, free = parse(argv)
    if not hosts:
        raise SystemExit("fan.py: no hosts (-H)")
    fan = Fan(hosts, workdir, items, free)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, fan.on_signal)
    fan.start()
    return fan.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
