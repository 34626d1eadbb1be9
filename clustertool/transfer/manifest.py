"""Manifests: what a tree holds (path, type, size, mtime, perms, hash), here or on nodes.

A node's manifest is computed by a small stdlib-only program (``nodeprogs/manifest.py``) sent
to ``python3 -`` over ssh stdin, so nothing needs installing on the nodes.  Hashes are
blake2b-128 from hashlib (present everywhere), so source and nodes always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterable

from clustertool.model import Node
from clustertool.nodeprogs import manifest as nodeprog_manifest
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import SSH, Transport

MAX_LISTED = 10  # files named per node in a mismatch message
Keep = Callable[[str, bool], bool]  # (relative path, is a directory) -> part of the source?


@dataclass
class Manifest:
    root: str
    exists: bool = True
    entries: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    is_dir: bool = True

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
                    head.get("dir", True))


def local(root: str, want_hash: bool | Iterable[str] = False, keep: Keep | None = None) -> Manifest:
    """Manifest of ``root`` on this machine; ``keep(rel, is_dir)`` filters it (see copy's ``keep``)."""
    out: list[str] = []
    want = want_hash if isinstance(want_hash, bool) else list(want_hash)
    nodeprog_manifest.run({"root": root, "hash": want}, out.append, keep=keep)
    return parse("".join(out))


def remote_args(root: str, want_hash: bool | Iterable[str] = False) -> bytes:
    want = want_hash if isinstance(want_hash, bool) else sorted(want_hash)
    return program_text("manifest", {"root": root, "hash": want})


def remote(cluster_name: str, nodes: list[Node], root: str, want_hash=False,
           timeout: float | None = None, transport: Transport = SSH) -> dict[str, Manifest | str]:
    """Manifest of ``root`` on every node, in parallel; a node that failed maps to its error.

    ``want_hash`` may be a function of the node name (per-node hash lists).
    """
    def data(node: Node) -> bytes:
        want = want_hash(node.name) if callable(want_hash) else want_hash
        return remote_args(root, want)

    group = run_on_nodes(cluster_name, nodes, python_command(), stdin_data=data, timeout=timeout,
                         transport=transport)
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


def compare(source: Manifest, dest: Manifest, *, extras: bool = False) -> list[str]:
    """Differences of dest from source, one short line each (empty: identical).

    Files must match in type, size, hash and permissions; symlinks in target;
    directories in permissions.  ``extras``: also name entries only dest has.
    """
    problems = []
    for path, s in source.entries.items():
        d = dest.entries.get(path)
        if d is None:
            problems.append(f"missing: {path}")
        elif d["t"] != s["t"]:
            problems.append(f"type differs: {path}")
        elif s["t"] == "f" and (d.get("s") != s.get("s") or d.get("h") != s.get("h")):
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
