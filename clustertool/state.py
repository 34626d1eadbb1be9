"""Per-cluster state under ``$CLUSTERTOOL_HOME`` (default ``~/.clustertool``).

Layout::

    clusters/<name>.json    the state file (one per cluster), written atomically
    clusters/<name>.lock    flock taken by any command that changes the cluster
    clusters/<name>/        key pair (0600), known_hosts, ssh_config, provider files

Writes go to a temp file in the same directory, are fsynced, then renamed over the old
file, so a crash never leaves half a state file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from clustertool.errors import StateError, UsageError
from clustertool.model import Cluster

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def home() -> Path:
    root = os.environ.get("CLUSTERTOOL_HOME") or os.path.join(os.path.expanduser("~"), ".clustertool")
    return Path(root)


def clusters_dir() -> Path:
    return home() / "clusters"


def validate_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise UsageError(
            f"invalid cluster name {name!r}",
            hint="use 1-31 characters: lowercase letters, digits and '-', starting with a letter",
        )
    return name


def state_path(name: str) -> Path:
    return clusters_dir() / f"{validate_name(name)}.json"


def cluster_dir(name: str) -> Path:
    return clusters_dir() / validate_name(name)


class ClusterPaths:
    """Where a cluster's files live."""

    def __init__(self, name: str):
        self.name = name
        self.root = cluster_dir(name)

    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def pubkey(self) -> Path:
        return self.root / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def control_dir(self) -> Path:
        # Unix socket paths are limited to ~108 bytes, so masters live under a short dir.
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"ct-{digest}"


def exists(name: str) -> bool:
    return state_path(name).exists()


def list_clusters() -> list[str]:
    d = clusters_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json"))


def load(name: str) -> Cluster:
    path = state_path(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(list_clusters()) or "none"
        raise StateError(f"no cluster named {name!r}", hint=f"known clusters: {known}") from None
    except (OSError, ValueError) as exc:
        raise StateError(f"state file {path} is unreadable: {exc}") from None
    return Cluster.from_dict(data)


def save(cluster: Cluster) -> Path:
    path = state_path(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{cluster.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(cluster.to_dict(), fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def delete(name: str) -> None:
    """Forget a cluster: its state file, lock and files directory."""
    with contextlib.suppress(FileNotFoundError):
        state_path(name).unlink()
    shutil.rmtree(cluster_dir(name), ignore_errors=True)
    shutil.rmtree(ClusterPaths(name).control_dir, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (clusters_dir() / f"{name}.lock").unlink()


@contextlib.contextmanager
def flocked(path: Path, timeout: float, busy: Exception, poll: float = 0.05) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; raise ``busy`` if it is not free within ``timeout``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy from None
                time.sleep(poll)
        yield


def locked(name: str, timeout: float = 30.0):
    """Hold the cluster's lock so two commands cannot change its state at once."""
    lock_path = clusters_dir() / f"{validate_name(name)}.lock"
    busy = StateError(f"cluster {name!r} is busy: another clustertool command holds its lock",
                      hint="wait for it to finish, then retry")
    return flocked(lock_path, timeout, busy)


def ready_cluster(name: str) -> Cluster:
    """The cluster, which must be up and wired for SSH (every command that runs on nodes)."""
    cluster = load(name)
    if cluster.status != "ready":
        raise UsageError(f"cluster {cluster.name!r} is {cluster.status}, not ready for SSH",
                         hint="bring it up without --no-ssh, or `clustertool start` it")
    return cluster


def resolve_name(name: str | None) -> str:
    """The cluster a command acts on: the one named, or the only one known."""
    if name:
        return validate_name(name)
    known = list_clusters()
    if len(known) == 1:
        return known[0]
    if not known:
        raise StateError("no clusters known", hint="bring one up with `clustertool up`")
    raise UsageError(
        f"several clusters known ({', '.join(known)}): say which with -c/--cluster",
    )
