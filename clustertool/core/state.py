"""Per-cluster state under ``$CLUSTERTOOL_HOME`` (default ``~/.clustertool``).

Layout::

    clusters/<name>.json    the state file (one per cluster), written atomically
    clusters/<name>.lock    flock taken by any command that changes the cluster; holds "<pid> <command>"
    clusters/<name>/        key pair (0600), known_hosts, ssh_config, provider files, marker.json
    home-id                 this home's random id (a cluster's owner is the AWS identity + this)

Writes go to a temp file in the same directory, are fsynced, then renamed over the old
file, so a crash never leaves half a state file.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Callable, Iterator

from clustertool.core.errors import StateError, UsageError
from clustertool.core.model import ClusterRecord, ClusterState

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
        """The cluster's private key: ECDSA P-256 (transport.KEYGEN_TYPE); ed25519 on AWS, whose
        key pairs cannot be ECDSA, and for clusters made before the handshake moved to P-256."""
        older = self.root / "id_ed25519"
        return older if older.exists() else self.root / "id_ecdsa"

    @property
    def pubkey(self) -> Path:
        return self.key.with_name(self.key.name + ".pub")

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


def load(name: str) -> ClusterRecord:
    path = state_path(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        held = holder(name)
        if held and held[1] == "up":
            raise being_created(name, held[0]) from None
        known = list_clusters()
        near = difflib.get_close_matches(name, known, n=1)
        hint = (f"did you mean -c {near[0]}?" if near else "known here: " + _choices(known).removeprefix("add ")) \
            if known else "no clusters here: `clustertool up` makes one"
        raise StateError(f"no cluster named {name!r}", hint=hint) from None
    except (OSError, ValueError) as exc:
        raise StateError(f"state file {path} is unreadable: {exc}") from None
    return ClusterRecord.from_dict(data)


def save(cluster: ClusterRecord) -> Path:
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
        lock_path(name).unlink()


# Given who holds a lock (pid, purpose; None when unknown), an error to raise at once instead of waiting.
Refuse = Callable[[tuple[int, str] | None], Exception | None]

@contextlib.contextmanager
def flocked(path: Path, timeout: float, busy: Exception, poll: float = 0.05,
            purpose: str = "", refuse: Refuse | None = None) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; raise ``busy`` if it is not free within ``timeout``.

    The holder writes ``<pid> <purpose>`` into the file, so a waiter can say who holds it;
    ``refuse(holder)`` may return an error to raise at once instead of waiting.  A lock file
    that is unlinked (a forgotten cluster) while someone waits on it is not trusted: the
    waiter opens the path again, so two processes never both hold "the" lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    while True:
        fh = open(path, "a+")
        try:
            if _acquire(fh, path, deadline, busy, poll, refuse):
                break
        except BaseException:
            fh.close()
            raise
        fh.close()  # the file was replaced while we waited: lock the new one
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()} {purpose}\n")
        fh.flush()
        yield
    finally:
        fh.close()


def _acquire(fh: IO[str], path: Path, deadline: float, busy: Exception, poll: float, refuse: Refuse | None) -> bool:
    """True once ``fh`` is locked and still is ``path``; False when ``path`` changed meanwhile."""
    while True:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            why = refuse(_read_holder(path)) if refuse else None
            if why is not None:
                raise why from None
            if time.monotonic() >= deadline:
                raise busy from None
            time.sleep(poll)
    try:
        same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
    except FileNotFoundError:
        same = False
    return same


def _read_holder(path: Path) -> tuple[int, str] | None:
    try:
        pid, _, purpose = path.read_text().strip().partition(" ")
        return int(pid), purpose
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """A process with this pid exists and has not ended (a zombie, ended but not yet reaped, has)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(name: str) -> Path:
    return clusters_dir() / f"{validate_name(name)}.lock"


def holder(name: str) -> tuple[int, str] | None:
    """(pid, purpose) of the process holding the cluster's lock now, or None when it is free."""
    path = lock_path(name)
    if not path.exists():
        return None
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or (0, "")
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def locked(name: str, timeout: float = 30.0, purpose: str = "") -> contextlib.AbstractContextManager[None]:
    """Hold the cluster's lock so two commands cannot change its state at once.

    A cluster being created (an ``up`` holds the lock) is refused at once, naming the pid:
    waiting for an ``up`` could take many minutes."""
    busy = StateError(f"cluster {name!r} is busy: another clustertool command holds its lock",
                      hint="wait for it to finish, then retry")

    def refuse(held: tuple[int, str] | None) -> Exception | None:
        if held and held[1] == "up" and _alive(held[0]):
            return being_created(name, held[0])
        return None
    return flocked(lock_path(name), timeout, busy, purpose=purpose, refuse=refuse)


def being_created(name: str, pid: int) -> StateError:
    return StateError(f"cluster {name!r} is being created by pid {pid}",
                      hint=f"wait for that `up` to finish, or stop it (kill -TERM {pid} rolls it back)")


def home_id() -> str:
    """This clustertool home's own random id (made once): half of a cluster's owner."""
    path = home() / "home-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another command made it a moment ago
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(6) + "\n")
    return path.read_text().strip()


def write_marker(name: str, cluster_id: str, hostfile: str | None = None) -> None:
    """The cluster's id (and hostfile) beside its key, so that a sweep after a lost state file
    can tell which local leftovers belong to the cluster it removed."""
    root = cluster_dir(name)
    root.mkdir(parents=True, exist_ok=True)
    (root / "marker.json").write_text(json.dumps({"id": cluster_id, "hostfile": hostfile}))


def read_marker(name: str) -> dict:
    try:
        return json.loads((cluster_dir(name) / "marker.json").read_text())
    except (OSError, ValueError):
        return {}


def require_ready(cluster: ClusterRecord) -> ClusterRecord:
    """The cluster, which must be up and wired for SSH (every command that runs on nodes)."""
    if cluster.status != ClusterState.READY:
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
    raise UsageError(f"several clusters known ({_listed(known)}): say which one", hint=_choices(known))


def _listed(names: list[str], most: int = 4) -> str:
    return ", ".join(names) if len(names) <= most else ", ".join(names[:most]) + f" and {len(names) - most} more"


def _choices(names: list[str], most: int = 4) -> str:
    """The -c choices, as a hint: every one where they are few."""
    if len(names) <= most:
        return "add " + " or ".join(f"-c {n}" for n in names)
    return f"add -c NAME: {', '.join(f'-c {n}' for n in names[:most])} ... (`clustertool ls` lists all {len(names)})"
