"""The cluster's munge key and munged's argv.

Slurm's daemons and clients prove who they are with munge credentials, which every node can check
only when all hold the same secret key.  The key is made here, on the user's machine (the
cluster's own folder, 0600), and reaches each node on the stdin of its remote shell -- never in an
argv (which ``ps`` shows every user of the node) and never in a log; on the node it is 0400 in a
0700 folder.  A node replaced later gets the same key from the same file.
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from clustertool.slurm import SlurmError
from clustertool.slurm.layout import Layout

KEY_BYTES = 128   # what mungekey makes by default (1024 bits); munged takes 32 to 1024 bytes
KEY_FILE = "munge.key"


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def ensure_key(folder: Path) -> bytes:
    """The cluster's key from ``folder``/munge.key, made there (0600, never overwritten) when absent."""
    path = Path(folder) / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_key(path)
    with os.fdopen(fd, "wb") as fh:
        key = new_key()
        fh.write(key)
    return key


def read_key(path: Path) -> bytes:
    if path.stat().st_mode & 0o077:
        raise SlurmError(f"{path} can be read by others than you", hint=f"chmod 600 {path}")
    key = path.read_bytes()
    if not 32 <= len(key) <= 1024:
        raise SlurmError(f"{path} is not a munge key ({len(key)} bytes; munged takes 32 to 1024)")
    return key


def key_b64(key: bytes) -> str:
    """The key as the node script's input (the script travels on stdin, so the key does too)."""
    return base64.b64encode(key).decode()


def munged_argv(layout: Layout) -> list[str]:
    """munged with the cluster's own key, socket, pid, log and seed (never /etc/munge's)."""
    return ["munged", f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
            f"--pid-file={layout.pid_file('munged')}", f"--log-file={layout.log_file('munged')}",
            f"--seed-file={layout.munge_seed}"]


def check_argv(layout: Layout) -> list[str]:
    """A credential made and decoded through the node's munged (the shell pipes one into the other)."""
    return ["munge", "--socket", layout.munge_socket, "--no-input"]


def decode_argv(layout: Layout) -> list[str]:
    return ["unmunge", "--socket", layout.munge_socket]
