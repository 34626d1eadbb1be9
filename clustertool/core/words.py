"""Counts in words: ``counted(1, "entry", "entries")`` is "1 entry", not "1 entries"."""

from __future__ import annotations


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the word for that many (``many``: the plural, where it is not ``one`` + "s")."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
