#!/usr/bin/env python3
"""The leader's waiter of a job run through Slurm (stdlib only; never imports clustertool).

launch.sh runs it in mpirun's place: the job is Slurm's already (jobs/slurmrun.py submitted it), and this
program follows it until Slurm says it ended, so that the job's folder on the leader tells `jobs`, `logs`
and `kill` what it always tells: ``log`` (what it prints), ``exit`` (launch.sh writes its exit code).

Every ``POLL`` seconds it asks ``scontrol -o show job`` and writes ``slurm.json`` in the job's folder when
something changed: Slurm's id, state and reason (PENDING Resources, Priority, Dependency ...), who
submitted it, its nodes, its batch host, how many times it was requeued, and one entry per attempt
(start, end, exit code from the job's ``ct:`` comment, cause).  A job requeued by its batch script
(``--restarts``) or by Slurm (a node died) waits out Slurm's requeue delay (BeginTime, two minutes) only
until this program sets its start time to now.  The batch output (the step's own lines: srun's and
mpirun's messages) is copied into the log: as it grows, where its file is on this node, else from the
batch host over ssh when the job ended.

ARGS: job_dir, slurm_id (else the first argument), conf (SLURM_CONF or null), batch_out (the path on every
node), poll, jobcomp (the controller's jobcomp/filetxt log on this node, or null: sacct), addresses (Slurm
node name -> address, for ssh).
"""

import json
import os
import re
import subprocess
import sys
import time

OPTS: dict = {}  # ARGS (prepended by nodeprogs.program_text), taken in by main
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}
REQUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}  # after a run: it was requeued
WORD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")


def slurm_env():
    env = dict(os.environ)
    if OPTS.get("conf"):
        env["SLURM_CONF"] = OPTS["conf"]
    return env


def slurm(argv, timeout=30):
    """(exit code, output) of a Slurm client."""
    try:
        done = subprocess.run(argv, env=slurm_env(), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 255, str(exc)
    return done.returncode, done.stdout + done.stderr


def show(job_id):
    """The job's fields (scontrol's one-line form), {} when Slurm no longer knows it, None when it did not answer."""
    code, out = slurm(["scontrol", "-o", "show", "job", job_id])
    if code != 0:
        return {} if "Invalid job id" in out else None
    return dict(WORD.findall(out.splitlines()[0] if out.strip() else ""))


def hostnames(nodelist):
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    code, out = slurm(["scontrol", "show", "hostnames", nodelist])
    return out.split() if code == 0 else [nodelist]


def attempt_codes(fields):
    """The exit codes the batch script kept in the job's comment, one per failed attempt (``ct:7,3``)."""
    comment = fields.get("Comment", "")
    if not comment.startswith("ct:"):
        return []
    return [int(c) for c in comment[3:].split(",") if c.strip().lstrip("-").isdigit()]


def exit_status(text):
    """``ExitCode=2:0`` -> 2; ``0:9`` (a signal) -> 137."""
    code, _, sig = (text or "0:0").partition(":")
    code_i = int(code) if code.lstrip("-").isdigit() else 1
    sig_i = int(sig) if sig.isdigit() else 0
    return code_i if code_i or not sig_i else 128 + sig_i


class Output:
    """The batch output, copied into the log (stdout) as it grows, where its file is readable here."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def pump(self, final=False):
        """Copy the complete lines written since the last call (``final``: the last, partial one too); False
        when the file is not on this node."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return False
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            lines, self.partial = lines + [self.partial], b""
        for line in lines:
            sys.stdout.write(line.decode("utf-8", "replace") + "\n")
        sys.stdout.flush()
        return True

    def fetch(self, host):
        """The whole file from the batch host, when it was not readable here."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, "cat", self.path]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return
        if done.returncode == 0:
            sys.stdout.write(done.stdout.decode("utf-8", "replace"))
            sys.stdout.flush()


class Waiter:
    def __init__(self):
        self.job_id = str(OPTS["slurm_id"])
        self.doc: dict = {"id": self.job_id, "state": "PENDING", "reason": "None", "user": "", "nodes": [],
                    "batch_host": "", "restarts": 0, "attempts": [], "exit_code": None}
        self.output = Output(OPTS["batch_out"])
        self.released: set = set()

    def save(self):
        path = os.path.join(OPTS["job_dir"], "slurm.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(self.doc, fh)
        os.replace(tmp, path)

    def say(self, text):
        sys.stdout.write(f"clustertool: Slurm job {self.job_id} {text}\n")
        sys.stdout.flush()

    def observe(self, fields):
        """Take in what scontrol says; True when something changed."""
        doc, before = self.doc, json.dumps(self.doc, sort_keys=True)
        state, reason = fields.get("JobState", doc["state"]), fields.get("Reason", "None")
        restarts = int(fields.get("Restarts", "0") or 0)
        doc["user"] = fields.get("UserId", doc["user"]).split("(", 1)[0]
        if restarts > doc["restarts"] or state in REQUEUED:
            self.close_attempt(attempt_codes(fields), reason)
            while len(doc["attempts"]) < restarts:  # a run that began and was requeued between two looks
                doc["attempts"].append({"attempt": len(doc["attempts"]) + 1, "start": None, "end": None, "code": None,
                                        "cause": None, "nodes": [], "batch_host": ""})
                self.close_attempt(attempt_codes(fields), reason)
        if state == "RUNNING" or state in FINAL:  # (COMPLETING: a run ending, perhaps before a requeue)
            self.open_attempt(fields, restarts)
        if state == "PENDING" and (state, reason) != (doc["state"], doc["reason"]) and reason != "None":
            self.say(f"pending ({reason})")
        doc.update(state=state, reason=reason, restarts=restarts, batch_host=fields.get("BatchHost", doc["batch_host"]))
        if state == "PENDING" and reason == "BeginTime" and restarts and restarts not in self.released:
            self.released.add(restarts)  # Slurm holds a requeued job two minutes; nothing here needs them
            slurm(["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"])
        return json.dumps(doc, sort_keys=True) != before

    def open_attempt(self, fields, restarts):
        """A run of the job seen for the first time (while it runs, or already ended: a short job)."""
        attempts = self.doc["attempts"]
        if attempts and (attempts[-1]["end"] is None or attempts[-1]["attempt"] == restarts + 1):
            return
        nodes = hostnames(fields.get("NodeList"))
        if not nodes:
            return  # it never ran (cancelled while pending)
        attempts.append({"attempt": restarts + 1, "start": time.time(), "end": None, "code": None, "cause": None,
                         "nodes": nodes, "batch_host": fields.get("BatchHost", "")})
        self.doc["nodes"] = sorted(set(self.doc["nodes"]) | set(nodes))
        self.say(f"running on {fields.get('NodeList')} (attempt {restarts + 1})")

    def close_attempt(self, codes, reason):
        """The last run ended and the job was requeued: by its batch script (a code more in the comment) or
        by Slurm (a node failed)."""
        attempts = self.doc["attempts"]
        if not attempts or attempts[-1]["end"] is not None:
            return
        last = attempts[-1]
        last["end"] = time.time()
        failed = sum(1 for a in attempts[:-1] if str(a.get("cause") or "").startswith("exit code"))
        if len(codes) > failed:
            last["code"] = codes[failed]
            last["cause"] = f"exit code {last['code']}"
            self.say(f"attempt {last['attempt']} failed with exit code {last['code']}: requeued")
        else:
            last["cause"] = "node failure"
            why = f" ({reason})" if reason not in ("None", "BeginTime", "") else ""
            self.say(f"attempt {last['attempt']}: a node failed{why}; Slurm requeued the job")

    def finish(self, fields):
        doc = self.doc
        state = fields.get("JobState", doc["state"])
        code = exit_status(fields.get("ExitCode"))
        if state == "COMPLETED":
            code = 0
        elif state == "CANCELLED":
            code = code or 143
        elif state in FINAL and code == 0:
            code = 1
        if doc["attempts"] and doc["attempts"][-1]["end"] is None:
            doc["attempts"][-1].update(end=time.time(), code=code,
                                       cause=None if code == 0 else (state.lower() if state != "FAILED"
                                                                     else f"exit code {code}"))
        doc.update(state=state, reason=fields.get("Reason", doc["reason"]), exit_code=code, ended=time.time())
        self.save()
        return code

    def copy_output(self):
        """What the batch output holds that the log does not yet: here, and from each other batch host."""
        self.output.pump(final=True)
        here = os.uname().nodename.split(".")[0]
        for host in dict.fromkeys(a.get("batch_host") for a in self.doc["attempts"] if a.get("batch_host")):
            if host.split(".")[0] != here:
                self.output.fetch(OPTS.get("addresses", {}).get(host, host))

    def run(self):
        self.save()
        poll, misses = float(OPTS.get("poll") or 1.0), 0
        fields: dict = {}
        while True:
            seen = show(self.job_id)
            if seen is None:
                misses += 1  # slurmctld did not answer (restarting, or busy): ask again
                if misses > int(OPTS.get("misses") or 300):
                    self.say("is unknown: slurmctld stopped answering")
                    return 1
            elif not seen:
                fields = dict(fields, **gone(self.job_id))
                break
            else:
                misses, fields = 0, seen
                if self.observe(fields):
                    self.save()
                if fields.get("JobState") in FINAL:
                    break
            self.output.pump()
            time.sleep(poll)
        code = self.finish(fields)
        self.copy_output()
        self.say(f"ended {fields.get('JobState', 'unknown')}, exit code {code}")
        return code


def gone(job_id):
    """A job Slurm forgot (MinJobAge): its last state from the controller's jobcomp log, else sacct."""
    path = OPTS.get("jobcomp")
    if path and os.path.exists(path):
        with open(path, errors="replace") as fh:
            lines = [ln for ln in fh if ln.startswith(f"JobId={job_id} ")]
        if lines:
            return dict(WORD.findall(lines[-1]))
    code, out = slurm(["sacct", "-P", "-n", "-X", "-j", job_id, "-o", "State,ExitCode"])
    if code == 0 and out.strip() and "|" in out:
        state, exit_code = out.strip().splitlines()[0].split("|")[:2]
        return {"JobState": state.split()[0], "ExitCode": exit_code}
    return {"JobState": "UNKNOWN", "ExitCode": "1:0"}


def main(args, argv):
    OPTS.update(args)
    if not OPTS.get("slurm_id") and len(argv) > 1:
        OPTS["slurm_id"] = argv[1]  # what sbatch printed, written beside this file
    return Waiter().run()


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    sys.exit(main(ARGS, sys.argv))  # noqa: F821
