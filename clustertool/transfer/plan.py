"""What to send to each node: incremental by size and mtime, then by hash where needed.

Pure functions over manifests.  A file is sent when the node lacks it, holds another type,
or another size; with equal size and mtime it counts as present (rsync's quick check); with
equal size but another mtime the hashes decide: equal content only gets its metadata fixed
("touch"), other content is sent.  Files interrupted mid-write have a fresh mtime (tar sets
the source's mtime after the data) so a re-run always re-checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertool.transfer.manifest import Manifest


@dataclass
class NodePlan:
    node: str
    send: list[str] = field(default_factory=list)         # entries to stream (files, links, dirs)
    touch: list[list] = field(default_factory=list)       # [path, mtime, perm] to fix in place
    delete: list[str] = field(default_factory=list)       # entries to remove first
    hash_check: list[str] = field(default_factory=list)   # same size, other mtime: compare hashes
    send_bytes: int = 0

    @property
    def empty(self) -> bool:
        return not (self.send or self.touch or self.delete or self.hash_check)


def _file_decision(s: dict, d: dict) -> str:
    """'send', 'skip', 'touch' or 'hash' for a regular file present on both sides."""
    if d.get("s") != s.get("s"):
        return "send"
    if "h" in s and "h" in d:
        if s["h"] != d["h"]:
            return "send"
        same_meta = d.get("m") == s.get("m") and d.get("x") == s.get("x")
        return "skip" if same_meta else "touch"
    if d.get("m") != s.get("m"):
        return "hash"
    return "skip" if d.get("x") == s.get("x") else "touch"


def _top_level(paths: list[str]) -> list[str]:
    """Drop paths whose parent directory is also in the list (deleted with it)."""
    chosen: set[str] = set()
    out = []
    for p in sorted(paths):
        parts = p.split("/")
        if any("/".join(parts[:i]) in chosen for i in range(1, len(parts))):
            continue
        chosen.add(p)
        out.append(p)
    return out


def plan_node(node: str, source: Manifest, dest: Manifest, *, delete: bool = False) -> NodePlan:
    plan = NodePlan(node)
    for path, s in source.entries.items():
        d = dest.entries.get(path)
        if d is not None and d["t"] != s["t"]:
            plan.delete.append(path)
            d = None
        if d is None:
            plan.send.append(path)
            continue
        if s["t"] == "f":
            decision = _file_decision(s, d)
            if decision == "send":
                plan.send.append(path)
            elif decision == "touch":
                plan.touch.append([path, s["m"], s["x"]])
            elif decision == "hash":
                plan.hash_check.append(path)
        elif s["t"] == "l" and d.get("l") != s.get("l"):
            plan.delete.append(path)
            plan.send.append(path)
        elif s["t"] == "d" and d.get("x") != s.get("x"):
            plan.touch.append([path, s["m"], s["x"]])
    if delete:
        plan.delete += [p for p in dest.entries if p not in source.entries]
    plan.delete = _top_level(plan.delete)
    plan.send_bytes = sum(source.entries[p].get("s", 0) for p in plan.send)
    return plan


def resolve_hashes(plan: NodePlan, source_hashes: dict[str, str | None], dest_hashes: dict[str, str | None],
                   source: Manifest) -> NodePlan:
    """Settle ``hash_check`` entries once both sides' hashes are known."""
    for path in plan.hash_check:
        s = source.entries[path]
        if source_hashes.get(path) is not None and source_hashes.get(path) == dest_hashes.get(path):
            plan.touch.append([path, s["m"], s["x"]])
        else:
            plan.send.append(path)
            plan.send_bytes += s.get("s", 0)
    plan.hash_check = []
    plan.send.sort()
    return plan


def union_send(plans: list[NodePlan], source: Manifest) -> list[str]:
    """Entries a chain must stream so every node gets what it lacks, parents first.

    Every directory on the way to a sent entry is included so that nodes which lack the
    directory get its permissions too (a directory entry is a few hundred bytes).
    """
    wanted: set[str] = set()
    for plan in plans:
        wanted.update(plan.send)
    for path in list(wanted):
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in source.entries:
                wanted.add(parent)
    return sorted(wanted)


def payload_bytes(paths: list[str], source: Manifest) -> int:
    return sum(source.entries[p].get("s", 0) for p in paths if source.entries[p]["t"] == "f")


def archive_bytes(paths: list[str], source: Manifest) -> int:
    """Size of the tar stream for these entries (512-byte headers, data rounded to 512)."""
    total = 1024
    for p in paths:
        e = source.entries[p]
        total += 512 + (512 if len(p.encode()) > 99 else 0)
        if e["t"] == "f":
            total += -(-e.get("s", 0) // 512) * 512
    return total
