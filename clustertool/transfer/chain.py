"""Pipelined relay: the source streams the files to hop 1, which writes them AND forwards the
same bytes to hop 2 at the same time, and so on; every link carries the data once, so the time
is about S/B whatever the number of nodes.

Every station runs the node program ``relay`` (``nodeprogs/stream.py``, ``extract.py``,
``relay.py``): the source hashes each file as it reads it and sends the hash after the data;
each hop hashes each file's bytes as it writes them and compares at the file's end, so a
verified copy costs no second read (see relay.py).  Before the stream starts, every node's
stations are prepared (in the copy's first round, ahead of the plan, or in a round of their
own): each hop's relay is stored in its status folder and its dialer forked, which opens
the ssh session to the next hop at once, so all links connect in parallel.

A relay keeps forwarding when its own writing fails (disk full, read-only) and keeps writing
when the next hop dies; its outcome comes back up the chain as a ``CTDONE`` line.  Nodes
after a dead hop get a truncated stream (and say nothing); ``copy`` re-plans them and runs a
repair chain that skips the dead node (drive.py).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from clustertool.nodeprogs import program_text

DEFAULT_CIPHER = "aes128-gcm@openssh.com"
PROGRESS_MARK = "CTPROG"
DONE_MARK = "CTDONE"

Progress = Callable[[str, int], None]  # (node name, bytes written so far)


def status_dir(run_id: str, node_name: str, pass_no: int = 1) -> str:
    """Per-run, per-pass, per-node folder (relative to the remote home: fine on shared homes)."""
    return f".cache/clustertool/copy-{run_id}-p{pass_no}-{node_name}"


def node_ssh_argv(cipher: str | None, config: str | None = None, options: tuple[str, ...] = ()) -> list[str]:
    """ssh between nodes for bulk data: batch mode, no compression, the chosen cipher.

    The node-side config (key, pinned hosts) applies; ``config`` names another file.
    """
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "Compression=no"]
    if config:
        argv += ["-F", config]
    argv += list(options)
    if cipher:
        argv += ["-c", cipher]
    return argv


def hop_ssh_argv(address: str, cipher: str | None) -> list[str]:
    """ssh from one node to the next in the relay; a dead next hop is noticed within seconds."""
    return node_ssh_argv(cipher, options=("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")) + [address]


def relay_command(sdir: str) -> str:
    """Remote command that runs the relay stored in a hop's folder (stdin: the stream)."""
    return f"exec $(command -v python3 || command -v python) {shlex.quote(sdir)}/relay.py"


def source_command(sdir: str) -> str:
    """Remote command for the source on the leader: the relay arrives on stdin; its folder is
    named too, so ``ps`` on the leader says which run and pass it belongs to."""
    return f"exec $(command -v python3 || command -v python) - {shlex.quote(sdir)}"


def hop_args(node_name: str, sdir: str, dest: str, extract: bool,
             next_hop: tuple[str, str] | None, cipher: str | None) -> dict:
    """ARGS of one hop's relay; ``next_hop`` is (address, the next hop's folder) or None (last).

    The hash to check with comes in the stream (the source's choice)."""
    forward = None
    if next_hop is not None:
        address, next_sdir = next_hop
        forward = hop_ssh_argv(address, cipher) + [relay_command(next_sdir)]
    return {"node": node_name, "sdir": sdir, "dest": dest, "extract": extract, "forward": forward,
            "dial": forward is not None}


def source_args(src_dir: str, names: list[str], algo: str | None, *, sdir: str | None = None,
                forward: list[str] | None = None) -> dict:
    """ARGS of the source: on the leader (``sdir``) it takes the link its dialer opened ahead;
    here it runs ``forward`` itself."""
    return {"node": "source", "sdir": sdir, "algo": algo, "source": {"root": src_dir, "names": names},
            "forward": forward, "dial": sdir is not None}


def hop_station(args: dict) -> dict:
    """What prepare does for a hop: store its relay (the previous dialer starts it), fork its dialer."""
    return {"sdir": args["sdir"], "program": program_text("relay", args).decode(), "forward": args["forward"]}


def source_station(sdir: str, next_hop: tuple[str, str], cipher: str | None) -> dict:
    """What prepare does for the source on the leader: only its dialer (the head sends the rest)."""
    address, next_sdir = next_hop
    return {"sdir": sdir, "forward": hop_ssh_argv(address, cipher) + [relay_command(next_sdir)]}


def prepare_program(stations: list[dict]) -> bytes:
    """The program (for ``python3 -``) that prepares a node's stations (nodeprogs/link.py)."""
    return program_text("link", {"prepare": stations})


def abort_command(run_id: str, pass_no: int | None = None) -> str:
    """Remote command that stops every station of a run (or of one pass) on a node and removes
    its folders.  Each relay and dialer recorded its own process group; killing it stops its ssh.
    """
    pattern = f".cache/clustertool/copy-{run_id}-" + ("*" if pass_no is None else f"p{pass_no}-*")
    return (f"for f in {pattern}/pgid*; do [ -s \"$f\" ] && kill -TERM -- -\"$(cat \"$f\")\" 2>/dev/null; "
            f"done; rm -rf {pattern}; true")


@dataclass
class HopStatus:
    node: str
    rc: str = "none"
    next_rc: str = "none"
    stderr: str = ""
    files: int = 0                 # files the stream held (written or not)
    verified: int = 0              # of those, written bytes hashed as the source's
    bytes: int = 0
    bad: list[list[str]] = field(default_factory=list)  # [reason, path] of files that differ or could not be written
    bad_count: int = 0

    @property
    def extracted_ok(self) -> bool:
        return self.rc == "0"


def hop_status(node: str, status: dict | None) -> HopStatus:
    """A relay's outcome (its CTDONE line; None: it never said, so its stream was cut)."""
    status = status or {}
    next_rc = status.get("next_rc")
    err = status.get("err") or ""
    if status.get("next_error"):
        err = (err + "; " if err else "") + status["next_error"]
    return HopStatus(node, str(status.get("rc", "missing")), "none" if next_rc is None else str(next_rc), err,
                     int(status.get("files", 0)), int(status.get("verified", 0)), int(status.get("bytes", 0)),
                     list(status.get("bad", [])), int(status.get("bad_count", 0)))


def parse_progress(line: str) -> tuple[str, int] | None:
    parts = line.split()
    if len(parts) == 3 and parts[0] == PROGRESS_MARK and parts[2].isdigit():
        return parts[1], int(parts[2])
    return None


def parse_done(line: str) -> tuple[str, dict] | None:
    """A hop's ``CTDONE <node> <json>`` line."""
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[0] == DONE_MARK:
        try:
            status = json.loads(parts[2])
        except ValueError:
            return None
        return (parts[1], status) if isinstance(status, dict) else None
    return None


@dataclass
class ChainRun:
    returncode: int
    stderr: str
    duration: float
    other_lines: list[str] = field(default_factory=list)
    source: dict | None = None      # the source's status line (files, bytes, errors, next_rc)
    done: dict[str, dict] = field(default_factory=dict)  # node -> its relay's outcome (CTDONE)


def stream(argv: list[str], stdin: bytes | None = None, *, on_progress: Progress | None = None,
           timeout: float | None = None) -> ChainRun:
    """Run the chain's head (the source: ssh to the leader's, or a local python fed its program on
    stdin); parse progress lines from the merged stderr of all stations."""
    started = time.monotonic()
    head = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if stdin is not None:
        threading.Thread(target=_feed, args=(head.stdin, stdin), daemon=True).start()
    other: list[str] = []
    out: list[bytes] = []
    done: dict[str, dict] = {}
    reader = threading.Thread(target=_read_progress, args=(head.stderr, on_progress, other, done), daemon=True)
    reader.start()
    head_out = head.stdout
    assert head_out is not None  # stdout=PIPE
    collector = threading.Thread(target=lambda: out.append(head_out.read()), daemon=True)
    collector.start()
    try:
        head.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
        other.append("chain timed out")
    except BaseException:  # Ctrl-C: stop the chain's head; the hops see their input end
        head.kill()
        raise
    reader.join(timeout=5)
    collector.join(timeout=5)
    return ChainRun(head.returncode, "\n".join(other), time.monotonic() - started, other,
                    _source_status(b"".join(out)), done)


def _source_status(text: bytes) -> dict | None:
    for raw in reversed(text.decode("utf-8", "replace").splitlines()):
        if raw.startswith("{"):
            try:
                return json.loads(raw)
            except ValueError:
                return None
    return None


def _feed(pipe: IO[bytes], blob: bytes) -> None:
    try:
        pipe.write(blob)
        pipe.close()
    except OSError:
        pass


def _read_progress(stream_: IO[bytes], on_progress: Progress | None, other: list[str], done: dict[str, dict]) -> None:
    for raw in iter(stream_.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        parsed, finished = parse_progress(line), parse_done(line)
        if finished is not None:
            done[finished[0]] = finished[1]
        elif parsed is not None:
            if on_progress is not None:
                on_progress(*parsed)
        elif line.strip():
            other.append(line)
