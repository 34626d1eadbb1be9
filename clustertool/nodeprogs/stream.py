"""The copy stream (stdlib only): how the source sends a tree, and the parser each hop reads it with.

Part of the node program ``relay`` (``program_text`` sends stream.py, extract.py and relay.py as
one file); also imported here by ``copy --from local`` and the tests.

The stream: ``CTSTREAM1\\n``, a JSON line ``{"algo": <the hash every file is checked with, or
null>}`` (so the hops learn it from the source), then per entry a JSON header line (``p`` path, ``t`` f|d|l, ``s``
size, ``m`` mtime in ns, ``x`` permission bits, ``l`` link target, owner ids ``u``/``g`` and
names ``un``/``gn``); a file's header is followed by exactly ``s`` bytes of data and a JSON
trailer line: ``h``, the source's hash of the bytes it read and sent (absent without
verification), or ``e`` when the file changed while it was read.  The end is
``{"end": 1, "n": <files sent>}``; a stream without it was cut short.
"""

import hashlib
import json
import os
import stat

MAGIC = b"CTSTREAM1\n"
CHUNK = 1 << 20
MAX_LINE = 1 << 20


class StreamError(Exception):
    """The stream is not what the source sends (cut short, corrupt, unsafe)."""


def new_hash(algo):
    if not algo:
        return None
    if algo == "blake2b-128":
        return hashlib.blake2b(digest_size=16)
    return hashlib.new(algo)


def line(record):
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def check_path(path):
    """A stream path must stay inside DEST."""
    if not path or path.startswith("/") or "\0" in path or ".." in path.split("/"):
        raise StreamError(f"unsafe path in stream: {path!r}")
    return path


# ---- the source --------------------------------------------------------------------------

def _owner(st):
    import grp
    import pwd
    rec = {"u": st.st_uid, "g": st.st_gid}
    try:
        rec["un"] = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        pass
    try:
        rec["gn"] = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        pass
    return rec


def header(rel, st):
    """The header record of one entry from its lstat (files: without the size, see pack)."""
    rec = {"p": rel, "m": st.st_mtime_ns, "x": stat.S_IMODE(st.st_mode)}
    rec.update(_owner(st))
    if stat.S_ISDIR(st.st_mode):
        rec["t"] = "d"
    elif stat.S_ISLNK(st.st_mode):
        rec["t"] = "l"
    elif stat.S_ISREG(st.st_mode):
        rec["t"], rec["s"] = "f", st.st_size
    else:
        rec["t"] = "o"
    return rec


def _send_file(fd, size, algo, write):
    """Stream exactly ``size`` bytes of an open file; (hash or None, problem or None)."""
    h, left = new_hash(algo), size
    while left:
        block = os.read(fd, min(CHUNK, left))
        if not block:
            while left:  # keep the stream in step: the promised size, zeros
                write(bytes(min(CHUNK, left)))
                left -= min(CHUNK, left)
            return None, "file shrank while being read"
        if h is not None:
            h.update(block)
        write(block)
        left -= len(block)
    if os.read(fd, 1):
        return None, "file grew while being read"
    return (h.hexdigest() if h is not None else None), None


def pack(root, names, algo, write):
    """Send ``names`` (relative to ``root``) as a stream through ``write``; the source's status."""
    done: dict = {"files": 0, "bytes": 0, "errors": []}
    write(MAGIC)
    write(line({"algo": algo}))
    for rel in names:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
            rec = header(rel, st)
            if rec["t"] == "l":
                rec["l"] = os.readlink(full)
            if rec["t"] != "f":
                if rec["t"] != "o":
                    write(line(rec))
                continue
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            done["errors"].append(f"{rel}: {exc.strerror or exc}")
            continue
        try:
            st = os.fstat(fd)
            rec["s"], rec["m"] = st.st_size, st.st_mtime_ns
            write(line(rec))
            try:
                digest, problem = _send_file(fd, st.st_size, algo, write)
            except OSError as exc:  # a read error: pad so the stream stays in step
                digest, problem = None, f"read error: {exc.strerror or exc}"
            if problem is None and os.fstat(fd).st_mtime_ns != st.st_mtime_ns:
                digest, problem = None, "file changed while being read"
        finally:
            os.close(fd)
        trailer = {} if algo is None else {"h": digest}
        if problem:
            trailer = {"e": problem}
            done["errors"].append(f"{rel}: {problem}")
        write(line(trailer))
        done["files"] += 1
        done["bytes"] += rec["s"]
    write(line({"end": 1, "n": done["files"]}))
    return done


# ---- reading the stream ------------------------------------------------------------------

class Unpacker:
    """Push parser: ``feed`` it chunks as they come; it calls the sink per entry.

    sink.start(rec) with the stream's first record (its hash), sink.begin_file(rec) -> handle,
    sink.data(handle, memoryview), sink.end_file(handle, trailer), sink.entry(rec) for
    directories and links, sink.end(rec) at the end record.
    """

    def __init__(self, sink):
        self.sink, self.state, self.pending = sink, "magic", bytearray()
        self.left, self.handle, self.done, self.payload = 0, None, False, 0

    def feed(self, data, n=None):
        """Parse ``data[:n]`` (bytes or a reused bytearray: the sink gets views into it)."""
        n = len(data) if n is None else n
        view, i = memoryview(data), 0
        while i < n:
            if self.state == "data":
                take = min(self.left, n - i)
                self.sink.data(self.handle, view[i:i + take])
                i, self.left, self.payload = i + take, self.left - take, self.payload + take
                if not self.left:
                    self.state = "trailer"
                continue
            j = data.find(b"\n", i, n)
            if j < 0:
                self.pending += view[i:n]
                if len(self.pending) > MAX_LINE:
                    raise StreamError("corrupt stream: a header line is too long")
                return
            self.pending += view[i:j]
            i = j + 1
            text, self.pending = bytes(self.pending), bytearray()
            self._line(text)

    def _line(self, text):
        if self.state == "magic":
            if text + b"\n" != MAGIC:
                raise StreamError("not a clustertool copy stream")
            self.state = "start"
            return
        if self.done:
            raise StreamError("corrupt stream: data after its end")
        try:
            rec = json.loads(text)
        except ValueError:
            raise StreamError("corrupt stream: a header is not JSON") from None
        if self.state == "start":
            if not isinstance(rec, dict) or "algo" not in rec:
                raise StreamError("corrupt stream: no hash named at its start")
            self.sink.start(rec)
            self.state = "header"
        elif self.state == "trailer":
            self.sink.end_file(self.handle, rec)
            self.handle, self.state = None, "header"
        elif "end" in rec:
            self.done = True
            self.sink.end(rec)
        elif rec.get("t") == "f":
            check_path(rec["p"])
            self.handle, self.left = self.sink.begin_file(rec), int(rec["s"])
            self.state = "data" if self.left else "trailer"
        elif rec.get("t") in ("d", "l"):
            check_path(rec["p"])
            self.sink.entry(rec)
        else:
            raise StreamError(f"corrupt stream: unknown entry {rec.get('t')!r}")

    def finish(self):
        if not self.done:
            raise StreamError("unexpected end of stream" + ("" if self.state != "magic" or self.pending
                                                             else " (no data)"))


HASH_CANDIDATES = ("sha256", "blake2b-128")


def fastest_hash(cpuinfo=None, machine=None):
    """The faster of sha256 and blake2b-128 on this CPU, decided by what the CPU has, not by a timing (which
    a busy machine turns either way: the same copy would name another hash each run): sha256 where the CPU
    has SHA instructions (x86 sha_ni, ARM sha2; about 1.8 GB/s), else blake2b (about 1.2 GB/s, where
    sha256 gets about 0.5).  ``cpuinfo``/``machine``: /proc/cpuinfo's text and the architecture (tests)."""
    import platform
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    machine = machine or platform.machine()
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if flags & {"sha_ni", "sha2"} or (not cpuinfo and machine in ("arm64", "aarch64")):  # macOS arm64: SHA2
        return "sha256"
    return "blake2b-128"
