"""Standalone program (stdlib only) that reads a job's output on one node, in whole lines.

Every rank's output is in its own files, written by that rank's Open MPI daemon on the rank's
node (``mpirun --output-filename OUT:nocopy``): ``OUT/<job>/rank.<N>/stdout`` and ``stderr``
(N zero-padded to the width of the largest rank).  A job run with ``--restarts`` writes attempt k
(k >= 1) to ``OUT/attempt.<k>/<job>/rank.<N>``; its lines are tagged ``[k+1,N]`` (the attempt's
number where the first attempt's say ``[1,N]``) and ordered after the attempt before.
mpirun's own messages are in the job's ``log`` on the leader.  This program turns those byte streams
into lines, each tagged
``[job,rank]<stream>:`` (or bare), and never cuts one: a partial last line is held until its
newline comes or the job has ended.  A line longer than ``MAX_LINE`` is passed on in pieces.

``ARGS`` (prepended by the sender, see ``program_text``)::

    out      the rank output folder (absolute)
    log      mpirun's log to include (leader), or null
    ranks    only these ranks (list), or null for all
    tag      prefix lines with [job,rank]<stream>:
    mode     "read": print what is there and exit; "follow": keep printing until the end
    tail     read/follow: start at the last N lines of each file (null: from the start)
    final    read: the job has ended, so a partial last line is printed as a line
    end      follow on the leader: {"job_dir": D, "marker": "CLUSTERTOOL_JOB=<id>"} -- ends once
             D/exit exists or launch.sh (whose pid is in D/launch.pid, marked so) is gone;
             follow elsewhere: {"stop": PATH} -- ends once PATH exists (the client makes it)
    keys     prefix every line with "<job> <rank> <stream#> " so the client can order lines; read
             also says first "found 1" (or 0: this node has no output folder nor log of the job)
    attempt  only this attempt's rank files (1: the first), or null for every attempt

In "follow" the program also ends, silently, when whoever reads it goes away (its output's other
end closes, or its parent changes): a follower never outlives the ``clustertool logs -f`` that
asked for it.
"""

import glob
import os
import select
import sys
import time

MAX_LINE = 1 << 20
POLL_S = 0.1
STREAMS = ("stdout", "stderr", "stddiag")
LOG_KEY = (1 << 30, 0, 0)  # mpirun's own lines: after every rank's when ordered
LAUNCH_WAIT_S = 30.0


class Source:
    """One file being read: where we are and the partial line held so far."""

    def __init__(self, path, key, tag_text):
        self.path, self.key, self.tag_text = path, key, tag_text
        self.pos = 0
        self.held = b""
        self.inode = None

    def take(self, data, final):
        """Complete lines out of what was held plus ``data``; keep the rest."""
        buf = self.held + data
        parts = buf.split(b"\n")
        self.held = parts.pop()
        while len(self.held) > MAX_LINE:
            parts.append(self.held[:MAX_LINE])
            self.held = self.held[MAX_LINE:]
        if final and self.held:
            parts.append(self.held)
            self.held = b""
        return [p[:-1] if p.endswith(b"\r") else p for p in parts]

    def read_new(self, final=False):
        try:
            st = os.stat(self.path)
        except OSError:
            return self.take(b"", final)
        size = st.st_size
        if size < self.pos or self.inode not in (None, st.st_ino):  # truncated or made anew: start over
            self.pos, self.held = 0, b""
        self.inode = st.st_ino
        chunks = []
        if size > self.pos:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                while True:
                    block = fh.read(1 << 20)
                    if not block:
                        break
                    chunks.append(block)
                    self.pos += len(block)
        return self.take(b"".join(chunks), final)


def tail_offset(path, lines):
    """Byte offset where the last ``lines`` complete-or-partial lines of ``path`` start."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = pos = fh.tell()
        if end == 0 or lines <= 0:
            return end
        fh.seek(end - 1)
        wanted = lines + (1 if fh.read(1) == b"\n" else 0)
        found = 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            i = len(block)
            while True:
                i = block.rfind(b"\n", 0, i)
                if i < 0:
                    break
                found += 1
                if found == wanted:
                    return pos + i + 1
        return 0


def attempt_of(out, rank_dir):
    """The attempt (0: the first) whose output ``rank_dir`` holds: OUT/<job>/rank.N or OUT/attempt.K/<job>/rank.N."""
    above = os.path.dirname(os.path.dirname(rank_dir))
    if os.path.normpath(above) == os.path.normpath(out):
        return 0
    name = os.path.basename(above)
    return int(name.split(".", 1)[1]) if name.startswith("attempt.") and name.split(".", 1)[1].isdigit() else None


def rank_sources(out, ranks, attempt=None):
    """Sources for the rank files under ``out`` (sorted by attempt, rank, stream); ``attempt``: only that one
    (1: the first)."""
    found = []
    base = glob.escape(out)
    paths = glob.glob(os.path.join(base, "*", "rank.*", "*")) + glob.glob(os.path.join(base, "attempt.*", "*",
                                                                                        "rank.*", "*"))
    for path in paths:
        rank_dir = os.path.dirname(path)
        job_text = os.path.basename(os.path.dirname(rank_dir))
        rank_text = os.path.basename(rank_dir).split(".", 1)[1]
        stream = os.path.basename(path)
        k = attempt_of(out, rank_dir)
        if k is None or not (job_text.isdigit() and rank_text.isdigit() and stream in STREAMS):
            continue
        job, rank = int(job_text) + k, int(rank_text)
        if (ranks is not None and rank not in ranks) or (attempt is not None and k + 1 != attempt):
            continue
        found.append(Source(path, (job, rank, STREAMS.index(stream)), f"[{job},{rank}]<{stream}>:".encode()))
    return sorted(found, key=lambda s: s.key)


class Reader:
    """Every source of one node: the rank files (found as they appear) and mpirun's log."""

    def __init__(self, args, write):
        self.args, self.write = args, write
        self.sources = {}
        self.ranks = set(args["ranks"]) if args.get("ranks") is not None else None

    def discover(self, start_at_tail):
        new = rank_sources(self.args["out"], self.ranks, self.args.get("attempt"))
        log = self.args.get("log")
        if log and os.path.exists(log):
            new.append(Source(log, LOG_KEY, b""))
        for src in new:
            if src.path in self.sources:
                continue
            if start_at_tail and self.args.get("tail") is not None:
                try:
                    src.pos = tail_offset(src.path, int(self.args["tail"]))
                except OSError:
                    pass
            self.sources[src.path] = src

    def emit(self, src, lines):
        if not lines:
            return
        prefix = b"%d %d %d " % src.key if self.args.get("keys") else b""
        tag = src.tag_text if self.args.get("tag", True) else b""
        self.write(b"".join(prefix + tag + line + b"\n" for line in lines))

    def pass_over(self, final=False):
        for src in sorted(self.sources.values(), key=lambda s: s.key):
            self.emit(src, src.read_new(final))


def ended(end, started):
    """Follow on the leader: the job is over (exit written, or launch.sh gone); elsewhere: told to stop."""
    if "stop" in end:
        return os.path.exists(end["stop"])
    d = end["job_dir"]
    if os.path.exists(os.path.join(d, "exit")):
        return True
    try:
        with open(os.path.join(d, "launch.pid")) as fh:
            pid = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic() - started > LAUNCH_WAIT_S
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return end["marker"].encode() not in fh.read().split(b"\0")
    except OSError:
        return True  # gone


def name_process():
    """Call this process ``ct-logs`` (not python), so it is never taken for a stray job process."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"ct-logs", 0, 0, 0)
    except (OSError, AttributeError):
        pass


def client_gone():
    """Whoever reads our output has gone: the pipe's (or terminal's) other end is closed."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def follow(reader, end):
    parent, started = os.getppid(), time.monotonic()
    reader.discover(start_at_tail=True)
    while True:
        over = ended(end, started)  # before reading: what was written before the end is read below
        reader.discover(start_at_tail=False)
        reader.pass_over(final=over)
        if over:
            if "stop" in end:
                try:
                    os.unlink(end["stop"])
                except OSError:
                    pass
            return
        if os.getppid() != parent or client_gone():
            return
        time.sleep(POLL_S)


def main(args):
    out = sys.stdout.buffer

    def write(data):
        out.write(data)
        out.flush()

    reader = Reader(args, write)
    try:
        if args.get("mode") == "follow":
            name_process()
            follow(reader, args["end"])
        else:
            reader.discover(start_at_tail=True)
            if args.get("keys"):  # whether this node has any of the job's output (cleaned away?)
                there = os.path.isdir(args["out"]) or bool(args.get("log") and os.path.exists(args["log"]))
                write(b"found %d\n" % there)
            reader.pass_over(final=bool(args.get("final")))
    except BrokenPipeError:
        pass


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    main(ARGS)  # noqa: F821
