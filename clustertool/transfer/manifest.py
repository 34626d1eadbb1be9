"""Manifests: what a tree holds (path, type, size, mtime, perms, hash), here or on nodes.

A node's manifest is computed by a small stdlib-only program (``nodeprogs/manifest.py``) sent
to ``python3 -`` over ssh stdin, so nothing needs installing on the nodes.  Hashes come from
hashlib (present everywhere); a copy picks the algorithm once (the source's fastest of sha256
and blake2b) and hands it to every manifest, so source and nodes always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterable

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import Node
from clustertool.nodeprogs import manifest, program_text, python_command
from clustertool.remote.group import run_on_nodes

MAX_LISTED = 10  # files named per node in a mismatch message
Keep = Callable[[str, bool], bool]  # (relative path, is a directory) -> part of the source?
WantHash = bool | Iterable[str]  # hash every file, or these (relative paths)


@dataclass
class Manifest:
    root: str
    exists: bool = True
    entries: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    is_dir: bool = True
    fastest: str | None = None      # the quickest hash on that machine, when asked
    unwritable: str | None = None   # why no folder can be made or written there (asked with ``writable``)

    @property
    def total_bytes(self) -> int:
        return sum(e.get("s", 0) for e in self.entries.values() if e["t"] == "f")

    @property
    def file_count(self) -> int:
        return sum(1 for e in self.entries.values() if e["t"] == "f")


def parse(text: str) -> Manifest:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty manifest output")
    head = json.loads(lines[0])
    entries = {}
    for line in lines[1:]:
        e = json.loads(line)
        entries[e["p"]] = e
    return Manifest(head["root"], head.get("exists", True), entries, head.get("error"),
                    head.get("dir", True), head.get("fastest"), head.get("unwritable"))


def _args(root: str, want_hash: WantHash, algo: str | None, **more: object) -> dict:
    want = want_hash if isinstance(want_hash, bool) else sorted(want_hash)
    args: dict[str, object] = {"root": root, "hash": want, "algo": algo}
    args.update({k: v for k, v in more.items() if v not in (None, False)})
    return args


def local(root: str, want_hash: WantHash = False, algo: str | None = None,
          pick_hash: bool = False, keep: Keep | None = None) -> Manifest:
    """Manifest of ``root`` on this machine; ``keep(rel, is_dir)`` filters it (see copy's ``keep``)."""
    out: list[str] = []
    manifest.run(_args(root, want_hash, algo, pick_hash=pick_hash), out.append, keep=keep)
    return parse("".join(out))


def remote_args(root: str, want_hash: WantHash = False, algo: str | None = None, *,
                program: str = "manifest", **more: object) -> bytes:
    return program_text(program, _args(root, want_hash, algo, **more))


def remote(session: ClusterSession, nodes: list[Node], root: str,
           want_hash: WantHash | Callable[[str], WantHash] = False, timeout: float | None = None, *,
           algo: str | None = None, pick_hash: bool = False, cleanup: Callable[[Node], list[str] | None] | None = None,
           prepare: Callable[[Node], list[dict] | None] | None = None,
           writable: bool = False) -> dict[str, Manifest | str]:
    """Manifest of ``root`` on every node, in parallel; a node that failed maps to its error.
    ``writable``: each says too whether a folder can be made and written at ``root`` (a copy's DEST).

    ``want_hash`` may be a function of the node name (per-node hash lists).  Functions of the
    node: ``cleanup`` gives copy station folders to stop and remove first; ``prepare`` the
    stations to prepare first (the copy's survey: relay.py's prepare, then the listing).
    """
    def data(node: Node) -> bytes:
        want = want_hash(node.name) if callable(want_hash) else want_hash
        stations = prepare(node) if prepare is not None else None
        return remote_args(root, want, algo, pick_hash=pick_hash, program="survey" if stations else "manifest",
                           cleanup=cleanup(node) if cleanup is not None else None, prepare=stations,
                           writable=writable)

    group = run_on_nodes(session, nodes, python_command(), stdin_data=data, timeout=timeout)
    out: dict[str, Manifest | str] = {}
    for r in group.results:
        if not r.ok:
            out[r.node] = r.reason
            continue
        try:
            out[r.node] = parse(r.stdout)
        except (ValueError, KeyError) as exc:
            out[r.node] = f"unreadable manifest: {exc}"
    return out


def is_unreachable(error: str) -> bool:
    return error.startswith("unreachable") or error == "timed out"


def compare(source: Manifest, dest: Manifest, *, extras: bool = False,
            verified: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Differences of dest from source, one short line each (empty: identical).

    Files must match in type, size, hash and permissions; symlinks in target;
    directories in permissions.  ``verified``: files whose content was already checked by
    hash in the copy's stream (only their size is compared here).  ``extras``: also name
    entries only dest has.
    """
    problems = []
    for path, s in source.entries.items():
        d = dest.entries.get(path)
        if d is None:
            problems.append(f"missing: {path}")
        elif d["t"] != s["t"]:
            problems.append(f"type differs: {path}")
        elif s["t"] == "f" and (d.get("s") != s.get("s") or (path not in verified and d.get("h") != s.get("h"))):
            problems.append(f"content differs: {path}")
        elif s["t"] == "l" and d.get("l") != s.get("l"):
            problems.append(f"link target differs: {path}")
        elif s["t"] in ("f", "d") and d.get("x") != s.get("x"):
            problems.append(f"permissions differ: {path} ({oct(d.get('x', 0))} != {oct(s.get('x', 0))})")
    if extras:
        problems += [f"extra: {p}" for p in dest.entries if p not in source.entries]
    return problems


def summarize(problems: list[str], limit: int = MAX_LISTED) -> str:
    shown = "; ".join(problems[:limit])
    more = len(problems) - limit
    return shown + (f"; ... and {more} more" if more > 0 else "")
