"""Standalone program (stdlib only) that lists a tree: it runs on nodes, sent over ssh stdin.

It must not import anything from clustertool: ``program_text()`` sends this file's source,
prefixed with its arguments, to ``python3 -`` on a node.  Locally the same functions are
imported directly.

Output: one JSON object per line (stable order, sorted by path)::

    {"p": "rel/path", "t": "f"|"d"|"l"|"o", "s": size, "m": mtime_s, "x": perm bits,
     "h": hash (files, when asked), "l": link target (symlinks)}

plus a first line ``{"root": ..., "exists": bool, "algo": ..., "error": ...}``.
Hashes come from hashlib (on every node): ARGS ``algo`` names one (stream.py's ``new_hash``;
default blake2b-128) so a source and its nodes always agree; ``pick_hash`` adds ``fastest``,
the quickest candidate on this CPU, to the first line.  ``cleanup``: copy station folders
(relative to $HOME) to stop and remove first.  Sent
after stream.py (``PARTS``); in a copy's first round (``survey``) after relay.py too, which
has prepared this node's stations by then.
"""

import json
import os
import shutil
import signal
import stat
import sys
import tempfile

if "new_hash" not in globals():  # imported here; on a node stream.py comes first
    from clustertool.nodeprogs.stream import fastest_hash, new_hash

CHUNK = 1 << 20
DEFAULT_ALGO = "blake2b-128"


def file_hash(path, algo=DEFAULT_ALGO):
    h = new_hash(algo)
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _entry(rel, st, full, want_hash, algo=DEFAULT_ALGO):
    mode = st.st_mode
    e = {"p": rel, "x": stat.S_IMODE(mode), "m": int(st.st_mtime)}
    if stat.S_ISLNK(mode):
        e["t"], e["l"] = "l", os.readlink(full)
    elif stat.S_ISDIR(mode):
        e["t"] = "d"
    elif stat.S_ISREG(mode):
        e["t"], e["s"] = "f", st.st_size
        if want_hash is True or (want_hash and rel in want_hash):
            e["h"] = file_hash(full, algo)
    else:
        e["t"] = "o"
    return e


def walk(root, want_hash=False, keep=None, algo=DEFAULT_ALGO):
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
        return [_entry(name, st, root, True if want_hash else False, algo)]
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
                out.append(_entry(rel, st, full, want_hash, algo))
            except OSError as exc:
                out.append({"p": rel, "t": "?", "err": str(exc)})
        dirnames[:] = [d for d in dirnames if d not in refused]
        # os.walk does not follow symlinked dirs by default; listed above as "l"
    out.sort(key=lambda e: e["p"])
    return out


def _stop_leftovers(sdir):
    """A station still running (its chain was cut, or never used): stop it, relay and dialer."""
    for name in ("pgid", "pgid.dial"):
        try:
            with open(os.path.join(sdir, name)) as fh:
                os.killpg(int(fh.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def clean_stations(sdirs):
    """Stop and remove copy stations that will not be used (a chain prepared ahead that the plan
    did not need, or one cut short); the count removed."""
    gone = 0
    for sdir in sdirs:
        if os.path.isdir(sdir):
            _stop_leftovers(sdir)
            shutil.rmtree(sdir, ignore_errors=True)
            gone += 1
    for folder in (".cache/clustertool", ".cache"):
        try:
            os.rmdir(folder)
        except OSError:
            break
    return gone


def unwritable(root):
    """Why no folder can be made or written at ``root`` (None: it can): the deepest existing folder on the way
    is probed by making an empty folder there and removing it again."""
    at = os.path.abspath(root)
    while not os.path.lexists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if not os.path.isdir(at):
        return f"{at} is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ct-probe-", dir=at))
    except OSError as exc:
        return f"{at}: {exc.strerror or exc}"
    return None


def run(args, write=sys.stdout.write, keep=None):
    root = os.path.expanduser(args["root"])
    want, algo = args.get("hash", False), args.get("algo") or DEFAULT_ALGO
    if isinstance(want, list):
        want = set(want)
    head = {"root": root, "exists": os.path.lexists(root), "dir": os.path.isdir(root), "algo": algo}
    if args.get("cleanup"):
        head["cleaned"] = clean_stations(args["cleanup"])
    if args.get("pick_hash"):
        head["fastest"] = fastest_hash()
    if args.get("writable"):
        head["unwritable"] = unwritable(root)
    try:
        entries = walk(root, want, keep, algo) if head["exists"] else []
    except OSError as exc:
        head["error"] = str(exc)
        entries = []
    write(json.dumps(head) + "\n")
    for e in entries:
        write(json.dumps(e) + "\n")


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "root" in ARGS:  # noqa: F821  (prepended)
    run(ARGS)  # noqa: F821
