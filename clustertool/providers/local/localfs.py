"""The local provider's shared filesystem: a folder on the leader's disk that every other node
mounts over sshfs (FUSE), with the cluster's own key and pinned host keys.

A stand-in for NFS (EFS) and Lustre (FSx), which this kernel cannot mount; what it shares is
real: a file one node writes is the file every other node reads. The folder lives on the
leader's /scratch (``/scratch/.clustertool-shared/<cluster>/<name>``), so it outlives `stop` and
goes with the cluster at `down`. The leader binds it at the mount point; the others run sshfs.

Mounts live in each node's own mount namespace, so no node sees another's, nor does this
machine. Only the empty mount-point folder (``/shared``) sits on this machine's root, where
every node sees it; like ``/scratch`` it is made once, remembered in a marker, and removed when
the last local cluster goes (``release_mountpoints``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clustertool.core.model import ClusterRecord
from clustertool.providers.base import ProvisionRequest
from clustertool.providers.local import sysops

EXPORT_ROOT = "/scratch/.clustertool-shared"
MOUNTPOINTS_MARKER = Path("/run/lock/clustertool-local.mountpoints")


def export_path(cluster: str, mount: str) -> str:
    """The leader's folder for the filesystem mounted at ``mount``, as the leader sees it."""
    slug = mount.strip("/").replace("/", "_") or "root"
    return f"{EXPORT_ROOT}/{cluster}/{slug}"


def _on_host(cluster: ClusterRecord, node_path: str) -> Path:
    """Where a path under the leader's /scratch lies on this machine."""
    nodes_dir = Path(cluster.provider_state["nodes_dir"])
    return nodes_dir / cluster.leader.name / "scratch" / os.path.relpath(node_path, "/scratch")


def make(request: ProvisionRequest) -> list[dict[str, Any]]:
    """Make each wanted local filesystem: the leader's folder and the mount point; record each at once."""
    cluster = request.cluster
    made = cluster.provider_state.setdefault("shared_fs", [])
    for fs in cluster.options.get("shared_fs") or []:
        if any(m["mount"] == fs["mount"] for m in made):
            continue  # recorded by an earlier try
        source = export_path(cluster.name, fs["mount"])
        folder = _on_host(cluster, source)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        ensure_mountpoint(fs["mount"])
        made.append({"kind": "local", "id": None, "mount": fs["mount"], "made": True, "dns": None,
                     "mount_name": None, "source": source})
        request.save()
        request.report(f"shared filesystem {fs['mount']}: {cluster.leader.name}:{source}, sshfs on every other node")
    return made


def _recorded() -> list[str]:
    try:
        return [line for line in MOUNTPOINTS_MARKER.read_text().splitlines() if line.startswith("/")]
    except FileNotFoundError:
        return []


def ensure_mountpoint(path: str) -> None:
    """``path`` must exist as a folder (on this machine's root, which every node shares); make it and
    every missing parent, remembering what was made, so the last cluster's `down` removes them."""
    with sysops.global_lock():
        missing = []
        probe = Path(path)
        while not probe.exists():
            missing.append(str(probe))
            probe = probe.parent
        if not missing:
            return
        MOUNTPOINTS_MARKER.parent.mkdir(parents=True, exist_ok=True)
        with MOUNTPOINTS_MARKER.open("a") as fh:  # written before the folders: a crash leaves no unknown one
            fh.writelines(p + "\n" for p in reversed(missing))
        os.makedirs(path, mode=0o755, exist_ok=True)


def release_mountpoints() -> list[str]:
    """At the last local cluster's end (under the global lock): remove the mount-point folders made
    for local shared filesystems, deepest first, where empty; keep the rest remembered."""
    kept, removed = [], []
    for path in sorted(set(_recorded()), key=lambda p: p.count("/"), reverse=True):
        try:
            os.rmdir(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(path)  # someone put something there: it stays
    if kept:
        MOUNTPOINTS_MARKER.write_text("".join(p + "\n" for p in kept))
    else:
        MOUNTPOINTS_MARKER.unlink(missing_ok=True)
    return [f"removed {', '.join(removed)} (mount point(s) made for local shared filesystems)"] if removed else []
