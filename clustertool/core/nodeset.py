"""Node sets: expand and fold ``node-[1-3,5]`` patterns, and select nodes of a cluster.

Syntax (a small subset of ClusterShell's)::

    node-7                  one name
    node-[2-5]              a range; ``node-[01-10]`` keeps the zero padding of the start
    node-[1-3,5],leader     comma lists, also inside brackets
    rack[1-2]-gpu[1-4]      several bracket groups expand as a cartesian product

Only letters, digits, ``. _ -`` and the syntax characters ``[ ] ,`` are accepted, so a
selection can never carry a shell metacharacter or whitespace anywhere.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Iterable

from clustertool.core.errors import UsageError

if TYPE_CHECKING:
    from clustertool.core.model import ClusterRecord, Node

MAX_EXPANSION = 100_000  # refuse patterns that would expand to more names than this
_NAME_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_PATTERN_CHARS = re.compile(r"^[A-Za-z0-9._\-\[\],]+$")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._\-\[\],]")
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")
_CHUNKS = re.compile(r"(\d+)")
_KEYWORDS = ("all", "leader", "members", "workers", "servers")


def natural_key(name: str) -> tuple:
    """Sort key that orders node-2 before node-10 (and node-1 before node-01)."""
    key: list[tuple] = []
    for i, chunk in enumerate(_CHUNKS.split(name)):
        key.append((1, int(chunk), len(chunk)) if i % 2 else (0, chunk))
    return tuple(key)


def check_chars(text: str, what: str = "node selection") -> None:
    """Reject whitespace, shell metacharacters and anything else outside the syntax."""
    if not text:
        raise UsageError(f"empty {what}", hint="e.g. leader, members, node-[2-5], node-1,node-3")
    bad = _BAD_CHAR.search(text)
    if bad:
        raise UsageError(
            f"{what} {text!r} contains {bad.group()!r}: only letters, digits, '.', '_', '-', "
            "'[', ']' and ',' are allowed",
            hint="e.g. leader, members, node-[2-5], node-1,node-3",
        )


def split_top(pattern: str) -> list[str]:
    """Split on commas that are not inside brackets; brackets must balance."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in pattern:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise UsageError(f"nested '[' in node pattern {pattern!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"unbalanced ']' in node pattern {pattern!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise UsageError(f"unclosed '[' in node pattern {pattern!r}")
    parts.append("".join(current))
    for part in parts:
        if not part:
            raise UsageError(f"empty item in node pattern {pattern!r}")
    return parts


def _has_pad(digits: str) -> bool:
    return len(digits) > 1 and digits[0] == "0"


def _expand_range(element: str, pattern: str) -> list[str]:
    lo, sep, hi = element.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise UsageError(
            f"bad range {element!r} in node pattern {pattern!r}: expected N or N-M, e.g. [1-4,7]"
        )
    if not sep:
        return [lo]
    width = len(lo) if _has_pad(lo) else 0
    if _has_pad(hi) and len(hi) != width:
        raise UsageError(f"inconsistent zero padding in range {element!r} of {pattern!r}")
    start, end = int(lo), int(hi)
    if start > end:
        raise UsageError(f"range {element!r} in node pattern {pattern!r} runs backwards")
    if end - start >= MAX_EXPANSION:
        raise UsageError(f"range {element!r} in node pattern {pattern!r} is too large")
    return [str(n).zfill(width) for n in range(start, end + 1)]


def _expand_item(item: str, pattern: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", item)
    choices: list[list[str]] = []
    total = 1
    for piece in pieces:
        if piece.startswith("["):
            body = piece[1:-1]
            if not body:
                raise UsageError(f"empty brackets in node pattern {pattern!r}")
            values: list[str] = []
            for element in body.split(","):
                if not element:
                    raise UsageError(f"empty item inside brackets of node pattern {pattern!r}")
                values.extend(_expand_range(element, pattern))
            choices.append(values)
            total *= len(values)
            if total > MAX_EXPANSION:
                raise UsageError(f"node pattern {pattern!r} expands to too many names")
        elif piece:
            choices.append([piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(pattern: str) -> list[str]:
    """All names a pattern denotes, in written order, duplicates removed."""
    check_chars(pattern, "node pattern")
    seen: dict[str, None] = {}
    for item in split_top(pattern):
        for name in _expand_item(item, pattern):
            seen.setdefault(name, None)
    if len(seen) > MAX_EXPANSION:
        raise UsageError(f"node pattern {pattern!r} expands to too many names")
    return list(seen)


def _runs(numbers: Iterable[str]) -> list[list[str]]:
    """Group digit strings into runs of consecutive values that one ``a-b`` can express."""
    runs: list[tuple[int, list[str]]] = []  # (width, digit strings)
    for digits in sorted(set(numbers), key=lambda d: (int(d), len(d))):
        value = int(digits)
        for width, run in runs:
            if int(run[-1]) == value - 1 and str(value).zfill(width) == digits:
                run.append(digits)
                break
        else:
            runs.append((len(digits) if _has_pad(digits) else 0, [digits]))
    ordered = sorted(runs, key=lambda r: (int(r[1][0]), r[0]))
    return [run for _, run in ordered]


def fold(names: Iterable[str]) -> str:
    """Fold names into a compact pattern: node-1,node-2,node-3,node-5 -> node-[1-3,5]."""
    groups: dict[tuple[str, str], list[str]] = {}
    plain: list[str] = []
    for name in set(names):
        if not _NAME_CHARS.match(name):
            raise UsageError(f"cannot fold node name {name!r}")
        match = _LAST_NUMBER.match(name)
        if match:
            groups.setdefault((match.group(1), match.group(3)), []).append(match.group(2))
        else:
            plain.append(name)
    tokens: list[tuple[tuple, str]] = [(natural_key(p), p) for p in plain]
    for (prefix, suffix), numbers in groups.items():
        runs = _runs(numbers)
        if len(runs) == 1 and len(runs[0]) == 1:
            text = f"{prefix}{runs[0][0]}{suffix}"
        else:
            body = ",".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
            text = f"{prefix}[{body}]{suffix}"
        tokens.append((natural_key(f"{prefix}{runs[0][0]}{suffix}"), text))
    return ",".join(text for _, text in sorted(tokens))


def _resolve(cluster: "ClusterRecord", token: str, usable: bool = False) -> list["Node"] | None:
    """Nodes one expanded token names, or None when it names nothing (``usable``: a group leaves
    cordoned nodes out)."""
    group = _group(cluster, token)
    if group is not None:
        return [n for n in group if not n.cordoned] if usable else group
    alias = token[len(cluster.name) + 1:] if token.startswith(f"{cluster.name}-") else None
    for node in cluster.nodes:
        if token == node.name or (alias is not None and alias == node.name):
            return [node]
    matches = [n for n in cluster.nodes if token in (n.address, n.ssh_host)]
    return matches or None


def _group(cluster: "ClusterRecord", token: str) -> list["Node"] | None:
    """The nodes of a group keyword (all, leader, members, workers, servers), or None for any other token."""
    if token in ("all", f"{cluster.name}-all"):
        return list(cluster.nodes)
    if token in ("leader", f"{cluster.name}-leader"):
        return [cluster.leader] if cluster.nodes else []
    if token in ("members", f"{cluster.name}-members"):
        return cluster.members
    if token in ("workers", f"{cluster.name}-workers"):
        return cluster.workers
    if token in ("servers", f"{cluster.name}-servers"):
        return cluster.servers
    return None


def select(cluster: "ClusterRecord", selection: str | None, *, usable: bool = False) -> list["Node"]:
    """The nodes a selection names, in cluster order (leader first), without duplicates.

    ``None`` or ``all`` is every node; otherwise a comma list of ``leader``, ``members``,
    ``workers`` (leader and members: the nodes that run ranks), ``servers`` (reduction servers),
    node names, ranges (``node-[2-5]``), the ssh aliases ``<cluster>-leader`` and
    ``<cluster>-node-3``, or node addresses.  ``usable`` (jobs): the groups leave cordoned nodes
    out; a cordoned node named by itself (name, range, address) stays, for the caller to refuse.
    """
    ordered = cluster.ordered_nodes()
    if selection is None:
        return ordered
    check_chars(selection)
    chosen: set[str] = set()
    unknown: list[str] = []
    for token in expand(selection):
        nodes = _resolve(cluster, token, usable)
        if nodes is None:
            unknown.append(token)
        else:
            chosen.update(n.name for n in nodes)
    if unknown:
        valid = fold(n.name for n in cluster.nodes) or "none"
        raise UsageError(
            f"cluster {cluster.name!r} has no node {fold(unknown)} "
            f"(its nodes: {valid}; also {', '.join(_KEYWORDS)})",
            hint="see `clustertool status` for node names",
        )
    return [n for n in ordered if n.name in chosen]
