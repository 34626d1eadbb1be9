"""What shared filesystems the user asked for: ``--shared-fs KIND[:ID][@PATH]`` or ``shared_fs:``.

Each wanted filesystem becomes ``{"kind": "local"|"efs"|"fsx", "id": str|None, "mount": "/shared"}``
(stored as ``cluster.options["shared_fs"]``). The first one without its own ``@PATH`` goes at
``--shared-mount`` (default ``/shared``), later ones at ``/shared2``, ``/shared3``, ...

A spec file lists strings in the flag's form, or mappings ``{kind, id, mount}``::

    shared_fs:
      - efs                      # a new EFS at /shared
      - kind: fsx
        id: fs-0123456789abcdef0 # an existing one, attached, never deleted
        mount: /data

Pure and dependency-free (core only): every bad input is one ``UsageError`` line.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from clustertool.core.errors import UsageError

KINDS = ("local", "efs", "fsx")
DEFAULT_MOUNT = "/shared"
_ID_RE = re.compile(r"^fs-[0-9A-Za-z]{1,40}$")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*$")
_MAPPING_KEYS = ("kind", "id", "mount")
# Top-level folders a filesystem must never be mounted over (the node would stop working).
_SYSTEM = {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "proc", "root", "run", "sbin",
           "sys", "tmp", "usr", "var"}


def _fail(item: Any, why: str, hint: str | None = None) -> UsageError:
    return UsageError(f"shared filesystem {_show(item)}: {why}", hint=hint)


def _show(item: Any) -> str:
    if isinstance(item, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in item.items()) + "}"
    return repr(item)


def check_mount(path: Any, item: Any = None) -> str:
    """``path`` as a clean absolute mount point, or a UsageError naming ``item``."""
    item = path if item is None else item
    if not isinstance(path, str) or not path:
        raise _fail(item, f"the mount point must be a path, got {_show(path)}")
    if not path.startswith("/"):
        raise _fail(item, f"the mount point {path!r} is relative", hint="give an absolute path such as /shared")
    if not _PATH_RE.match(path):
        raise _fail(item, f"the mount point {path!r} has characters other than letters, digits and ._-/")
    clean = posixpath.normpath(path)
    if clean.startswith("//"):
        clean = "/" + clean.lstrip("/")
    if ".." in clean.split("/") or clean == "/" or clean.split("/")[1] in _SYSTEM and clean.count("/") == 1:
        raise _fail(item, f"cannot mount over {clean!r}", hint="pick a folder of its own such as /shared or /data")
    return clean


def _from_string(text: str) -> dict[str, Any]:
    rest, at, mount = text.strip().partition("@")
    kind, colon, fs_id = rest.partition(":")
    if at and not mount:
        raise _fail(text, "nothing after '@'", hint="KIND[:ID][@PATH], e.g. efs@/shared")
    if colon and not fs_id:
        raise _fail(text, "nothing after ':'", hint="KIND[:ID][@PATH], e.g. efs:fs-0123456789abcdef0")
    return {"kind": kind.strip(), "id": fs_id.strip() or None, "mount": mount.strip() or None}


def _from_mapping(item: dict[Any, Any]) -> dict[str, Any]:
    unknown = sorted(str(k) for k in item if k not in _MAPPING_KEYS)
    if unknown:
        raise _fail(item, f"unknown key {unknown[0]!r}", hint="keys: " + ", ".join(_MAPPING_KEYS))
    if "kind" not in item:
        raise _fail(item, "no 'kind'", hint="kind: " + " | ".join(KINDS))
    fs_id = item.get("id")
    if fs_id is not None and not isinstance(fs_id, str):
        raise _fail(item, f"the id must be a string, got {_show(fs_id)}")
    return {"kind": item["kind"], "id": fs_id or None, "mount": item.get("mount")}


def _one(item: Any) -> dict[str, Any]:
    if isinstance(item, str):
        fs = _from_string(item)
    elif isinstance(item, dict):
        fs = _from_mapping(item)
    else:
        raise _fail(item, "expected KIND[:ID][@PATH] or a mapping {kind, id, mount}")
    kind = fs["kind"]
    if not isinstance(kind, str) or kind.lower() not in KINDS:
        raise _fail(item, f"unknown kind {_show(kind)}", hint="kinds: " + ", ".join(KINDS))
    fs["kind"] = kind.lower()
    if fs["kind"] == "local" and fs["id"]:
        raise _fail(item, "a local shared filesystem takes no id", hint="write just: local")
    if fs["id"] and not _ID_RE.match(fs["id"]):
        raise _fail(item, f"{fs['id']!r} is not a filesystem id", hint="ids look like fs-0123456789abcdef0")
    if fs["mount"] is not None:
        fs["mount"] = check_mount(fs["mount"], item)
    return fs


def _next_default(taken: set[str], first: str) -> str:
    if first not in taken:
        return first
    n = 2
    while f"{first}{n}" in taken:
        n += 1
    return f"{first}{n}"


def _items(values: Any) -> list[Any]:
    if values is None:
        return []
    if isinstance(values, (str, dict)):
        return [values]
    if isinstance(values, (list, tuple)):
        return list(values)
    raise _fail(values, "expected a list of KIND[:ID][@PATH] or mappings {kind, id, mount}")


def parse_shared_fs(values: Any, default_mount: str | None = None) -> list[dict[str, Any]]:
    """The wanted shared filesystems, validated: a list of ``{"kind", "id", "mount"}``.

    ``values``: None, one item or a list of items; an item is ``"KIND[:ID][@PATH]"`` or a mapping
    ``{kind, id, mount}`` (so an already-parsed list parses to itself). ``default_mount``
    (``--shared-mount``) places the first filesystem that names no path of its own.
    """
    first = check_mount(default_mount, f"--shared-mount {default_mount}") if default_mount else DEFAULT_MOUNT
    wanted = [_one(item) for item in _items(values)]
    taken = {fs["mount"] for fs in wanted if fs["mount"]}
    for fs in wanted:
        if fs["mount"] is None:
            fs["mount"] = _next_default(taken, first)
            taken.add(fs["mount"])
    _check_together(wanted)
    return wanted


def _check_together(wanted: list[dict[str, Any]]) -> None:
    seen_mounts: dict[str, dict[str, Any]] = {}
    seen_ids: set[str] = set()
    for fs in wanted:
        label = fs["kind"] + (f":{fs['id']}" if fs["id"] else "") + f"@{fs['mount']}"
        if fs["mount"] in seen_mounts:
            raise _fail(label, f"{fs['mount']} is the mount point of another shared filesystem too",
                        hint="give each its own path: KIND[:ID]@PATH")
        for other in seen_mounts:
            inner, outer = sorted((fs["mount"], other), key=len, reverse=True)
            if inner.startswith(outer + "/"):
                raise _fail(label, f"{inner} lies inside the shared mount {outer}",
                            hint="mount shared filesystems side by side, not one inside another")
        if fs["id"] in seen_ids:
            raise _fail(label, f"{fs['id']} is listed twice")
        seen_mounts[fs["mount"]] = fs
        if fs["id"]:
            seen_ids.add(fs["id"])


def describe(fs: dict[str, Any]) -> str:
    """``efs:fs-1@/shared`` / ``local@/shared``: one wanted filesystem in the flag's own form."""
    return fs["kind"] + (f":{fs['id']}" if fs.get("id") else "") + f"@{fs['mount']}"
