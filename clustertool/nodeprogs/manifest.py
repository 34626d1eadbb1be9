"""Standalone program (stdlib only) that lists a tree: it runs on nodes, sent over ssh stdin.

It must not import anything from clustertool: ``program_text()`` sends this file's source,
prefixed with its arguments, to ``python3 -`` on a node.  Locally the same functions are
imported directly.

Output: one JSON object per line (stable order, sorted by path)::

    {"p": "rel/path", "t": "f"|"d"|"l"|"o", "s": size, "m": mtime_s, "x": perm bits,
     "h": hash (files, when asked), "l": link target (symlinks)}

plus a first line ``{"root": ..., "exists": bool, "algo": ..., "error": ...}``.
Hashes are blake2b-128 (hashlib, everywhere) so a source and a node always agree.
"""

import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 20


def file_hash(path):
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _entry(rel, st, full, want_hash):
    mode = st.st_mode
    e = {"p": rel, "x": stat.S_IMODE(mode), "m": int(st.st_mtime)}
    if stat.S_ISLNK(mode):
        e["t"], e["l"] = "l", os.readlink(full)
    elif stat.S_ISDIR(mode):
        e["t"] = "d"
    elif stat.S_ISREG(mode):
        e["t"], e["s"] = "f", st.st_size
        if want_hash is True or (want_hash and rel in want_hash):
            e["h"] = file_hash(full)
    else:
        e["t"] = "o"
    return e


def walk(root, want_hash=False, keep=None):
    """Entries of the tree under root (root itself excluded), sorted by path.

    ``want_hash``: True (every file), False, or a set of relative paths to hash.
    A root that is a single file yields one entry named after the file.
    ``keep(rel, is_dir)`` (local sources only): entries it refuses are left out, and a refused
    directory is not entered.
    """
    root = os.fsdecode(root)
    out = []
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        name = os.path.basename(root.rstrip("/"))
        return [_entry(name, st, root, True if want_hash else False)]
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        refused = set()
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else rel_dir + "/" + name
            try:
                st = os.lstat(full)
                if keep is not None and not keep(rel, stat.S_ISDIR(st.st_mode)):
                    refused.add(name)
                    continue
                out.append(_entry(rel, st, full, want_hash))
            except OSError as exc:
                out.append({"p": rel, "t": "?", "err": str(exc)})
        dirnames[:] = [d for d in dirnames if d not in refused]
        # os.walk does not follow symlinked dirs by default; listed above as "l"
    out.sort(key=lambda e: e["p"])
    return out


def run(args, write=sys.stdout.write, keep=None):
    root = os.path.expanduser(args["root"])
    want = args.get("hash", False)
    if isinstance(want, list):
        want = set(want)
    head = {"root": root, "exists": os.path.lexists(root), "dir": os.path.isdir(root),
            "algo": "blake2b-128"}
    try:
        entries = walk(root, want, keep) if head["exists"] else []
    except OSError as exc:
        head["error"] = str(exc)
        entries = []
    write(json.dumps(head) + "\n")
    for e in entries:
        write(json.dumps(e) + "\n")


if __name__ == "__main__" and "ARGS" in globals():
    run(ARGS)  # noqa: F821  (prepended by program_text)
