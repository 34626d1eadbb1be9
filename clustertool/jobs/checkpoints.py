"""Where a restarted job finds its checkpoints (issue 35, section 7): `run --checkpoint-dir DIR`.

A job run with --restarts (or --replace-failed) starts again after a failure; after a lost leader it starts on
a new leader whose disk is empty, so a checkpoint rank 0 wrote on the old leader's disk is gone and the job
starts from step 0.  `run` says so in one warning line unless the job names a checkpoint folder on a shared
filesystem of the cluster (`up --shared-fs`: every node mounts it; the local provider's kind is a folder of
the leader over sshfs, a stand-in for a real shared filesystem).  Every rank gets the folder as
``CLUSTERTOOL_CHECKPOINT_DIR`` (examples/ddp_checkpoint.py reads it).
"""

from __future__ import annotations

import posixpath

from clustertool.core.model import ClusterRecord

ENV = "CLUSTERTOOL_CHECKPOINT_DIR"
NONE = ("a lost leader restarts this job from step 0 unless its checkpoints are on shared storage: "
        "--checkpoint-dir DIR on a shared filesystem (`up --shared-fs`)")


def shared_mounts(cluster: ClusterRecord) -> list[str]:
    """The mount points of the cluster's shared filesystems (what its provider made or attached)."""
    return [str(fs["mount"]) for fs in cluster.provider_state.get("shared_fs") or [] if fs.get("mount")]


def under(path: str, mount: str) -> bool:
    path, mount = posixpath.normpath(path), posixpath.normpath(mount)
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def warning(cluster: ClusterRecord, checkpoint_dir: str | None, restarts: int) -> str | None:
    """The one line `run` warns with (None: nothing to say): only for jobs that restart."""
    if not restarts:
        return None
    if checkpoint_dir is None:
        return NONE
    mounts = shared_mounts(cluster)
    if any(under(checkpoint_dir, m) for m in mounts):
        return None
    where = f"the cluster's shared filesystems: {', '.join(mounts)}" if mounts else \
        "the cluster has no shared filesystem (`up --shared-fs`)"
    return (f"--checkpoint-dir {checkpoint_dir} is not on a shared filesystem ({where}): the leader's copy dies "
            "with it, and a lost leader restarts this job from step 0")
