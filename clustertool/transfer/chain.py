"""Pipelined relay: the source streams a tar to hop 1, which extracts AND forwards to hop 2
at the same time, and so on; every link carries the data once, so the time is about S/B
whatever the number of nodes.

Each hop runs ``nodeprogs/hop.sh`` written to its own status directory beforehand (so no
command nests another's quoting)::

    tee -p >(extract) | ssh -c CIPHER NEXT 'bash <status dir of NEXT>/hop.sh'

``tee -p`` keeps forwarding when the local extraction fails (disk full, not writable) and
keeps extracting when the next hop dies; the hop records tar's exit code and stderr in its
status directory.  Nodes after a dead hop get a truncated stream; ``copy`` notices them in
verification and runs a repair chain that skips the dead node (see drive.py).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from clustertool.nodeprogs import shell_script

DEFAULT_CIPHER = "aes128-gcm@openssh.com"
CHECKPOINT_RECORDS = 800   # tar checkpoint every 800 records of 10 KiB = 8 MiB
RECORD_BYTES = 10240
PROGRESS_MARK = "CTPROG"

Progress = Callable[[str, int], None]  # (node name, bytes received so far)


def status_dir(run_id: str, node_name: str) -> str:
    """Per-run, per-node directory (relative to the remote home: also fine on shared homes)."""
    return f".cache/clustertool/copy-{run_id}-{node_name}"


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


def tar_extract_argv(node_name: str) -> list[str]:
    """tar that unpacks stdin into the current directory, keeping perms, links, times."""
    action = f"exec=echo {PROGRESS_MARK} {node_name} $TAR_CHECKPOINT >&3"
    return ["tar", "-x", "-f", "-", "-p", "--warning=no-timestamp",
            f"--checkpoint={CHECKPOINT_RECORDS}", f"--checkpoint-action={action}"]


def tar_create_argv(src_dir: str) -> list[str]:
    """tar that streams the NUL-separated entry names read on stdin from src_dir."""
    return ["tar", "-c", "-f", "-", "-C", src_dir, "--no-recursion", "--null",
            "--verbatim-files-from", "-T", "-"]


def hop_script(dest: str, sdir: str, node_name: str, extract: bool,
               next_hop: tuple[str, str] | None, cipher: str | None) -> str:
    """The bash program one hop runs (nodeprogs/hop.sh): extract into ``dest`` and/or forward.

    ``next_hop`` is (address, status dir of the next node) or None for the last hop.
    """
    forward: list[str] = []
    if next_hop is not None:
        address, next_sdir = next_hop
        forward = hop_ssh_argv(address, cipher) + [f"bash {shlex.quote(next_sdir)}/hop.sh"]
    return shell_script("hop", SDIR=sdir, DEST=dest, EXTRACT=int(extract),
                        TAR_EXTRACT=tar_extract_argv(node_name), FORWARD=forward)


def prepare_command(sdir: str) -> str:
    """Remote command that stores the hop script (given on stdin) in a fresh status dir.

    Status dirs that an interrupted copy left behind more than a day ago are removed.
    """
    q = shlex.quote(sdir)
    stale = ("find .cache/clustertool -maxdepth 1 -name 'copy-*' -mmin +1440 "
             "-exec rm -rf {} + 2>/dev/null; ")
    return f"{stale}rm -rf {q} && mkdir -p {q} && cat > {q}/hop.sh"


def collect_command(sdir: str) -> str:
    """Remote command printing a hop's status (rc, next_rc, stderr tail), then removing it."""
    q = shlex.quote(sdir)
    return (f"cd {q} 2>/dev/null || {{ echo 'rc=missing'; exit 0; }}; "
            "echo \"rc=$(cat rc 2>/dev/null || echo none)\"; "
            "echo \"next_rc=$(cat next_rc 2>/dev/null || echo none)\"; "
            "head -c 4000 err 2>/dev/null | grep -v '^tar: Exiting with failure' | head -n 3; "
            f"cd && rm -rf {q}; rmdir .cache/clustertool .cache 2>/dev/null; true")


def leader_source_command(src_dir: str, first: tuple[str, str], cipher: str | None,
                          source_sdir: str | None = None) -> str:
    """On the source node: tar the names given on stdin and stream them to the first hop.

    With ``source_sdir``, the pipeline's process group is recorded there (for abort).
    """
    address, first_sdir = first
    forward = hop_ssh_argv(address, cipher) + [f"bash {shlex.quote(first_sdir)}/hop.sh"]
    pipeline = f"{shlex.join(tar_create_argv(src_dir))} | {shlex.join(forward)}"
    if source_sdir is None:
        return pipeline
    q = shlex.quote(source_sdir)
    return f"mkdir -p {q} && ps -o pgid= $$ | tr -d ' ' > {q}/pgid; {pipeline}; rc=$?; rm -rf {q}; exit $rc"


def abort_command(run_id: str) -> str:
    """Remote command that stops every hop (and source) of a run on a node and removes its files.

    Each hop recorded its own process group; killing it stops its tar, tee and onward ssh.
    """
    pattern = f".cache/clustertool/copy-{run_id}-*"
    return (f"for f in {pattern}/pgid; do [ -s \"$f\" ] && kill -TERM -- -\"$(cat \"$f\")\" 2>/dev/null; "
            f"done; rm -rf {pattern}; true")


@dataclass
class HopStatus:
    node: str
    rc: str = "none"
    next_rc: str = "none"
    stderr: str = ""

    @property
    def extracted_ok(self) -> bool:
        return self.rc == "0"


def parse_status(node: str, text: str) -> HopStatus:
    st = HopStatus(node)
    rest = []
    for line in text.splitlines():
        if line.startswith("rc="):
            st.rc = line[3:]
        elif line.startswith("next_rc="):
            st.next_rc = line[8:]
        elif line.strip():
            rest.append(line.strip())
    st.stderr = "; ".join(rest)
    return st


def parse_progress(line: str) -> tuple[str, int] | None:
    parts = line.split()
    if len(parts) == 3 and parts[0] == PROGRESS_MARK and parts[2].isdigit():
        return parts[1], int(parts[2]) * RECORD_BYTES
    return None


@dataclass
class ChainRun:
    returncode: int
    stderr: str
    duration: float
    other_lines: list[str] = field(default_factory=list)


def stream(argv: list[str], names: list[str], *, local_tar: list[str] | None = None,
           on_progress: Progress | None = None, timeout: float | None = None) -> ChainRun:
    """Run the chain's head (``argv``: ssh to the source or the first hop) feeding it names or
    a local tar stream; parse progress lines from the merged stderr of all hops."""
    started = time.monotonic()
    names_blob = b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in names)
    tar = None
    if local_tar is not None:
        tar = subprocess.Popen(local_tar, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
        head = subprocess.Popen(argv, stdin=tar.stdout, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        tar.stdout.close()
        feeder = tar
    else:
        head = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        feeder = head
    threading.Thread(target=_feed, args=(feeder.stdin, names_blob), daemon=True).start()
    other: list[str] = []
    reader = threading.Thread(target=_read_progress, args=(head.stderr, on_progress, other), daemon=True)
    reader.start()
    try:
        head.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
        other.append("chain timed out")
    except BaseException:  # Ctrl-C: stop the chain's head; the hops see their input end
        for proc in (head, tar):
            if proc is not None:
                proc.kill()
        raise
    finally:
        if tar is not None:
            tar.wait()
            other += [ln for ln in tar.stderr.read().decode(errors="replace").splitlines() if ln]
    reader.join(timeout=5)
    return ChainRun(head.returncode, "\n".join(other), time.monotonic() - started, other)


def _feed(pipe, blob: bytes) -> None:
    try:
        pipe.write(blob)
        pipe.close()
    except OSError:
        pass


def _read_progress(stream_, on_progress: Progress | None, other: list[str]) -> None:
    for raw in iter(stream_.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        parsed = parse_progress(line)
        if parsed is None:
            if line.strip():
                other.append(line)
        elif on_progress is not None:
            on_progress(*parsed)
