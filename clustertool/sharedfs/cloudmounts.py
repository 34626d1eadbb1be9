"""Mount commands of the AWS kinds, from what the API answered (``provider_state["shared_fs"]`` entries):

- ``efs``: the kernel's NFS client with the options AWS documents for EFS (NFSv4.1, 1 MiB reads and
  writes, hard mounts, a 60 s timeout, 2 retransmissions, ``noresvport`` so a reconnect gets a new
  port), source ``DNS:/``;
- ``fsx``: the Lustre client, ``mount -t lustre DNS@tcp:/MOUNTNAME MOUNT`` with ``relatime,flock``.

Both give an fstab line with ``_netdev,nofail``: a reboot mounts them again once the network is up,
and a node whose file system is unreachable still boots.  Before mounting, each checks that the
node has the client and otherwise fails with one line that says what to install.
"""

from __future__ import annotations

from typing import Any

from clustertool.core.errors import ProviderError
from clustertool.sharedfs.argv import MountCommand, MountTarget, register

EFS_OPTIONS = ("nfsvers=4.1", "rsize=1048576", "wsize=1048576", "hard", "timeo=600", "retrans=2", "noresvport")
LUSTRE_OPTIONS = ("relatime", "flock")
BOOT_OPTIONS = ("_netdev", "nofail")
NFS_MISSING = "no NFS client on this node (mount.nfs4 missing): install nfs-common (Ubuntu) or nfs-utils"
LUSTRE_MISSING = ("no Lustre client on this node (mount.lustre / the lustre module missing): install "
                  "lustre-client-modules-$(uname -r) (Ubuntu) or lustre-client (Amazon Linux), or use a Deep "
                  "Learning AMI, which carries it")


def _need(entry: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if not entry.get(k)]
    if missing:
        raise ProviderError(f"shared filesystem {entry.get('kind')} {entry.get('id')}: no {', '.join(missing)} "
                            "recorded (its `up` did not finish)", hint="`clustertool down` and `up` again")


def client_check(tool: str, module: str | None, message: str) -> list[str]:
    """argv that succeeds when the node has ``tool`` (or the kernel ``module``), else prints ``message`` and
    fails (its output becomes the node's one-line reason)."""
    probe = f"command -v {tool} >/dev/null 2>&1 || [ -x /sbin/{tool} ] || [ -x /usr/sbin/{tool} ]"
    if module:
        probe += f" || modinfo {module} >/dev/null 2>&1"
    return ["sh", "-c", f"{probe} || {{ echo '{message}'; exit 1; }}"]


def efs_source(entry: dict[str, Any]) -> str:
    _need(entry, "dns")
    return f"{entry['dns']}:/"


def efs_argv(entry: dict[str, Any]) -> list[str]:
    return ["mount", "-t", "nfs4", "-o", ",".join(EFS_OPTIONS), efs_source(entry), entry["mount"]]


def efs_fstab(entry: dict[str, Any]) -> str:
    return f"{efs_source(entry)} {entry['mount']} nfs4 {','.join(EFS_OPTIONS + BOOT_OPTIONS)} 0 0"


def lustre_source(entry: dict[str, Any]) -> str:
    _need(entry, "dns", "mount_name")
    return f"{entry['dns']}@tcp:/{entry['mount_name']}"


def lustre_argv(entry: dict[str, Any]) -> list[str]:
    return ["mount", "-t", "lustre", "-o", ",".join(LUSTRE_OPTIONS), lustre_source(entry), entry["mount"]]


def lustre_fstab(entry: dict[str, Any]) -> str:
    return f"{lustre_source(entry)} {entry['mount']} lustre {','.join(LUSTRE_OPTIONS + BOOT_OPTIONS)} 0 0"


@register("efs")
def efs_mount(target: MountTarget) -> MountCommand:
    fs = target.fs
    return MountCommand(argv=efs_argv(fs), before=[client_check("mount.nfs4", None, NFS_MISSING)],
                        fstab=efs_fstab(fs))


@register("fsx")
def lustre_mount(target: MountTarget) -> MountCommand:
    fs = target.fs
    return MountCommand(argv=lustre_argv(fs), before=[client_check("mount.lustre", "lustre", LUSTRE_MISSING)],
                        fstab=lustre_fstab(fs))
