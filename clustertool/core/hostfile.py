"""Hostfiles: render and parse the Open MPI, MPICH, Horovod and DeepSpeed formats.

=========  ==========================  ====================================
format     written as                  used by
=========  ==========================  ====================================
openmpi    ``ADDR slots=N`` per line   ``mpirun --hostfile``
mpich      ``ADDR:N`` per line         ``mpiexec -f`` (Hydra)
horovod    ``a:N,b:N`` on one line     ``horovodrun -H``
deepspeed  ``ADDR slots=N`` per line   ``deepspeed --hostfile``
=========  ==========================  ====================================

The parser accepts any of these, ``max_slots=`` / ``max-slots=``, ``# comments`` and
blank lines, and names the line of anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustertool.core.errors import SpecError, UsageError

if TYPE_CHECKING:
    from clustertool.core.model import ClusterRecord

FORMATS = ("openmpi", "mpich", "horovod", "deepspeed")

_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_KEYWORDS = {"slots": "slots", "max_slots": "max_slots", "max-slots": "max_slots"}
_EXPECTED = "expected 'HOST [slots=N] [max_slots=N]', 'HOST:N' or 'HOST:N,HOST:N,...'"


@dataclass
class HostEntry:
    host: str
    slots: int | None = None
    max_slots: int | None = None

    def as_tuple(self) -> tuple[str, int | None]:
        return (self.host, self.slots)


def host_problem(host: str) -> str | None:
    """Why ``host`` is not an IPv4 address or DNS host name, or None when it is one."""
    if not host:
        return "empty host name"
    if len(host) > 253:
        return f"host name {host[:20]!r}... is longer than 253 characters"
    labels = host.split(".")
    if all(label.isdigit() for label in labels):
        if len(labels) != 4 or any(int(p) > 255 or len(p) > 3 for p in labels):
            return f"{host!r} is not a valid IPv4 address"
        return None
    if not all(_LABEL.match(label) for label in labels) or not host.isascii():
        return f"{host!r} is not a valid host name or IPv4 address"
    return None


def valid_host(host: str) -> bool:
    return host_problem(host) is None


def render(entries: list[tuple[str, int]], fmt: str) -> str:
    """The hostfile text for ``(address, slots)`` entries, in the given order."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown hostfile format {fmt!r}", hint=f"choose one of: {', '.join(FORMATS)}")
    for host, slots in entries:
        problem = host_problem(host)
        if problem:
            raise UsageError(f"cannot write a hostfile entry: {problem}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise UsageError(f"cannot write a hostfile entry for {host}: slots must be a positive integer, got "
                             f"{slots!r}")
    if not entries:
        return ""
    if fmt == "horovod":
        return ",".join(f"{host}:{slots}" for host, slots in entries) + "\n"
    if fmt == "mpich":
        return "".join(f"{host}:{slots}\n" for host, slots in entries)
    return "".join(f"{host} slots={slots}\n" for host, slots in entries)


def render_cluster(cluster: "ClusterRecord", fmt: str = "openmpi") -> str:
    """The cluster's hostfile: leader first, private addresses, each node's slots (servers are not ranks;
    cordoned nodes are left out until uncordoned)."""
    return render([(n.address, n.slots) for n in cluster.schedulable], fmt)


def _positive(text: str, what: str, where: str) -> int:
    if not text.isdigit() or not text.isascii() or int(text) < 1:
        raise SpecError(f"{where}: {what} must be a positive integer, got {text!r}")
    return int(text)


def _checked_host(host: str, where: str) -> str:
    problem = host_problem(host)
    if problem:
        raise SpecError(f"{where}: {problem}; {_EXPECTED}")
    return host


def _parse_colon_items(line: str, where: str) -> list[HostEntry]:
    """``a:4,b:4`` (Horovod) or ``a:4`` (MPICH); a bare ``a`` item means no slot count."""
    entries = []
    for item in line.split(","):
        item = item.strip()
        if not item:
            raise SpecError(f"{where}: empty item in {line!r}; {_EXPECTED}")
        host, sep, count = item.partition(":")
        slots = _positive(count, f"slot count of {host}", where) if sep else None
        entries.append(HostEntry(_checked_host(host, where), slots))
    return entries


def _parse_mpi_line(words: list[str], where: str) -> HostEntry:
    """``HOST [slots=N] [max_slots=N]`` (Open MPI, DeepSpeed)."""
    host = _checked_host(words[0], where)
    values: dict[str, int] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        name = _KEYWORDS.get(key)
        if not sep or name is None:
            raise SpecError(f"{where}: unexpected {word!r} after host {host}; expected slots=N or max_slots=N")
        if name in values:
            raise SpecError(f"{where}: {key} given twice for host {host}")
        values[name] = _positive(value, key, where)
    slots, max_slots = values.get("slots"), values.get("max_slots")
    if slots is not None and max_slots is not None and max_slots < slots:
        raise SpecError(f"{where}: max_slots={max_slots} is less than slots={slots} for host {host}")
    return HostEntry(host, slots, max_slots)


def parse(text: str, source: str = "<hostfile>") -> list[HostEntry]:
    """Hosts listed in a hostfile of any supported format, in file order."""
    entries: list[HostEntry] = []
    text = text[1:] if text.startswith("\ufeff") else text  # a BOM from Windows editors
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        if "=" not in line and ("," in line or ":" in line):
            entries.extend(_parse_colon_items(line, where))
        elif "," in line or ":" in line:
            raise SpecError(f"{where}: cannot read {line!r}; {_EXPECTED}")
        else:
            entries.append(_parse_mpi_line(line.split(), where))
    return entries
