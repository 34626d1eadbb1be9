"""Mount commands, one builder per shared-filesystem kind, as argv lists (pure, unit-tested).

The core's mount phase (``mount``) asks ``mount_command(target)`` what to run on one node for
one filesystem, and runs it in its own idempotent wrapper (skip when already mounted, mkdir,
sudo when the user is not root, an fstab line when the kind gives one). A kind adds itself with
``@register("efs")``; this module holds the ``local`` kind (sshfs to the leader's export).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from clustertool.core.errors import NotSupported


@dataclass(frozen=True)
class MountTarget:
    """One node about to mount one shared filesystem."""

    fs: dict[str, Any]  # the provider_state["shared_fs"] entry: kind, id, mount, dns, mount_name, source
    cluster: str  # the cluster's name: its key on the nodes is ~/.ssh/clustertool-<cluster>
    node: str  # the node's name
    is_leader: bool
    leader_address: str  # the leader's private address, as the nodes reach it
    user: str  # the cluster's login user


@dataclass(frozen=True)
class MountCommand:
    """What mounts one filesystem on one node."""

    argv: list[str]  # the mount command (run as root: the mount phase adds sudo when needed)
    before: list[list[str]] = field(default_factory=list)  # argv run first (e.g. mkdir of the source)
    fstab: str | None = None  # an /etc/fstab line, so a reboot mounts it again; None: remounted by the tool
    remote: bool = True  # False: a bind of a folder on this node (the local leader's own export)


Builder = Callable[[MountTarget], MountCommand]
BUILDERS: dict[str, Builder] = {}
# Kinds whose builders live in a module of their own, loaded by name on first use.
MODULES = {"efs": "clustertool.sharedfs.cloudmounts", "fsx": "clustertool.sharedfs.cloudmounts"}


def register(kind: str) -> Callable[[Builder], Builder]:
    """Decorator: ``builder`` makes the mount command of ``kind``."""
    def add(builder: Builder) -> Builder:
        BUILDERS[kind] = builder
        return builder
    return add


def mount_command(target: MountTarget) -> MountCommand:
    kind = target.fs["kind"]
    if kind not in BUILDERS and kind in MODULES:
        try:
            importlib.import_module(MODULES[kind])
        except ModuleNotFoundError:
            pass
    builder = BUILDERS.get(kind)
    if builder is None:
        raise NotSupported(f"no mount command for shared filesystems of kind {kind!r}",
                           hint="kinds with one: " + ", ".join(sorted(BUILDERS)))
    return builder(target)


# ---- local: the leader's folder over sshfs (FUSE), the stand-in for NFS / Lustre ------------

SSHFS_OPTIONS = (
    "reconnect",  # the leader restarting (reboot) does not leave a dead mount behind
    "ServerAliveInterval=5", "ServerAliveCountMax=3",
    "dir_cache=no",  # a file another node just wrote shows up at once, as on NFS
    "allow_other",  # every user of the node sees it, not only the one who mounted it
    "BatchMode=yes", "StrictHostKeyChecking=yes",
)


def sshfs_argv(source_host: str, source: str, mount: str, cluster: str, user: str = "root") -> list[str]:
    """``sshfs USER@HOST:SOURCE MOUNT`` over the cluster's own key and pinned host keys."""
    options = [*SSHFS_OPTIONS,
               f"IdentityFile=~/.ssh/clustertool-{cluster}",
               f"UserKnownHostsFile=~/.ssh/clustertool-{cluster}.known_hosts"]
    return ["sshfs", f"{user}@{source_host}:{source}", mount, "-o", ",".join(options)]


@register("local")
def local_mount(target: MountTarget) -> MountCommand:
    """The leader binds its exported folder at the mount point; every other node mounts it with sshfs."""
    source, mount = target.fs["source"], target.fs["mount"]
    if target.is_leader:
        return MountCommand(argv=["mount", "--bind", source, mount], before=[["mkdir", "-p", source]],
                            remote=False)
    return MountCommand(argv=sshfs_argv(target.leader_address, source, mount, target.cluster, target.user))
