"""Fan-out: parallel rsync from the source node to every target over the cluster's ssh.

Simple and incremental (rsync's own size+mtime check, delta transfer), but the source's
link carries one copy per node, so it takes about N*S/B.  Used for few nodes or small data,
and as the `--strategy fanout` baseline.

Verified in the stream too, by rsync itself: for every file it transfers, the receiver
computes a whole-file checksum over the bytes it writes and compares it with the one the
sender computed over the bytes it read (MD5, or xxh128 when both ends have rsync 3.2+), and
sends the file again on a mismatch.  The files rsync names as received (``>f``) therefore
need no re-read; ``copy`` re-reads only the others.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import Node
from clustertool.remote.transport import alias, classify_ssh_failure, warm_jump
from clustertool.transfer.chain import DEFAULT_CIPHER, Progress, node_ssh_argv, status_dir

FILE_MARK = "CTFILE"


def remote_shell(cipher: str | None, config: str | None = None) -> str:
    """The -e argument of rsync: the same node-to-node ssh as the relay's."""
    return shlex.join(node_ssh_argv(cipher, config))


def rsync_argv(src: str, src_is_dir: bool, target: str, dest: str, *, cipher: str | None = DEFAULT_CIPHER,
               delete: bool = False, config: str | None = None) -> list[str]:
    """rsync SRC to target:DEST keeping links, perms, times; one line per file sent."""
    argv = ["rsync", "-a", "-s", "--mkpath", f"--out-format={FILE_MARK} %i %l %n",
            "-e", remote_shell(cipher, config)]
    if delete:
        argv.append("--delete")
    source = src.rstrip("/") + "/" if src_is_dir else src
    return argv + [source, f"{target}:{dest.rstrip('/') or '/'}/"]


@dataclass
class RsyncResult:
    node: str
    exit_code: int | None
    bytes_sent: int
    files_sent: int
    error: str | None
    duration: float
    names: list[str] = field(default_factory=list)  # the files received (checked by rsync as written)


_ESCAPE_RE = re.compile(rb"\\#([0-7]{3})")


def unescape_name(text: str) -> str:
    """rsync writes unprintable bytes of a name as backslash-#-octal; back to the name's own bytes."""
    raw = _ESCAPE_RE.sub(lambda m: bytes([int(m.group(1), 8)]), text.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


def parse_file_line(line: str) -> tuple[int, str] | None:
    """(bytes, name) of a regular file rsync sent (itemized '>f...'), None for other lines."""
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) == 4 and parts[0] == FILE_MARK and parts[1][:2] in (">f", "<f") and parts[2].isdigit():
        return int(parts[2]), unescape_name(parts[3])
    return None


def _run_one(node: str, argv: list[str], on_bytes: Progress | None,
             procs: list[subprocess.Popen]) -> RsyncResult:
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    procs.append(proc)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # PIPE
    err: list[str] = []
    def collect() -> None:  # line by line: a lingering ssh master may hold the pipe open past exit
        for raw in iter(stderr.readline, b""):
            err.append(raw.decode(errors="replace").rstrip("\n"))

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    sent = files = 0
    names: list[str] = []
    for raw in iter(stdout.readline, b""):
        line = raw.decode("utf-8", "surrogateescape")
        got = parse_file_line(line)
        if got is not None:
            files += 1
            sent += got[0]
            names.append(got[1])
            if on_bytes is not None:
                on_bytes(node, sent)
        elif line.strip():  # an rsync on a node writes its messages here too (2>&1, see from_source_node)
            err.append(line.rstrip("\n"))
    proc.wait()
    t.join(timeout=5)
    error = None
    if proc.returncode != 0:
        text = "\n".join(err)
        error = classify_ssh_failure(text) if proc.returncode == 255 else None
        error = error or ("; ".join(ln for ln in err[-3:] if ln.strip()) or f"rsync exit {proc.returncode}")
    return RsyncResult(node, proc.returncode, sent, files, error, time.monotonic() - started, names)


def run_parallel(jobs: list[tuple[str, list[str]]], on_bytes: Progress | None = None) -> dict[str, RsyncResult]:
    """Run (node name, argv) jobs at once; every job's outcome is a value."""
    results: dict[str, RsyncResult] = {}
    threads: list[threading.Thread] = []
    procs: list[subprocess.Popen] = []
    for node, argv in jobs:
        def work(node: str = node, argv: list[str] = argv) -> None:
            results[node] = _run_one(node, argv, on_bytes, procs)
        t = threading.Thread(target=work, daemon=True)
        t.start()
        threads.append(t)
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except BaseException:  # Ctrl-C: stop every rsync we started
        for proc in procs:
            proc.kill()
        raise
    return results


def tracked(command: str, sdir: str) -> str:
    """Run ``command`` recording its process group in sdir (so an abort can stop it)."""
    q = shlex.quote(sdir)
    return f"mkdir -p {q} && ps -o pgid= $$ | tr -d ' ' > {q}/pgid; {command}; rc=$?; rm -rf {q}; exit $rc"


def from_source_node(session: ClusterSession, source: Node, targets: list[Node], src: str, src_is_dir: bool,
                     dest: str, *, cipher: str | None, delete: bool, on_bytes: Progress | None = None,
                     run_id: str | None = None) -> dict[str, RsyncResult]:
    """rsync on the source node to every target at once (one ssh session per target)."""
    jobs = []
    for node in targets:
        # rsync's messages ("Read-only file system") go to the session's stdout, read to its end
        # before we look: on ssh's stderr stream CI once lost them when the rsync exited at once
        command = shlex.join(rsync_argv(src, src_is_dir, node.address, dest, cipher=cipher, delete=delete)) + " 2>&1"
        if run_id is not None:
            command = tracked(command, status_dir(run_id, f"fanout-{node.name}"))
        jobs.append((node.name, session.argv(source, command)))
    return run_parallel(jobs, on_bytes)


def from_local(cluster_name: str, config: str, leader: Node, src: str, src_is_dir: bool, dest: str, *,
               cipher: str | None, delete: bool, on_bytes: Progress | None = None) -> RsyncResult:
    """rsync from this machine to the leader (through the cluster's ssh config; a jump host's
    ControlMaster opened first)."""
    warm_jump(cluster_name, alias(cluster_name, leader))
    argv = rsync_argv(src, src_is_dir, alias(cluster_name, leader), dest, cipher=cipher,
                      delete=delete, config=config)
    return run_parallel([(leader.name, argv)], on_bytes)[leader.name]
