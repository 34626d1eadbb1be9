"""Which files of a local folder `run --sync` sends: ``.gitignore`` and ``.clustertoolignore`` rules.

One matcher for every folder, a git checkout or not (git itself is not asked: it knows nothing of
``.clustertoolignore``).  Rules follow gitignore(5):

* blank lines and ``#`` comments are skipped; ``\\#`` and ``\\!`` start a pattern with that
  character; trailing spaces are dropped unless escaped (``foo\\ ``);
* ``!pattern`` re-includes what an earlier pattern excluded; the last matching rule wins;
* ``pattern/`` matches directories only;
* a pattern with a ``/`` at its start or in its middle is anchored at the folder of its file;
  without one it matches a name at any depth;
* ``*`` and ``?`` never match ``/``; ``[a-z]``, ``[!x]`` are character classes; leading ``**/``
  matches in every folder, trailing ``/**`` everything inside, ``/**/`` zero or more folders;
* a file whose parent folder is excluded stays excluded (a ``!`` rule cannot bring it back).

Each folder may hold both files; ``.clustertoolignore`` is read after ``.gitignore`` (so it can
override it), deeper folders after shallower ones.  Inside a git checkout the ignore files of
the folders above the synced one, up to the checkout's top, apply too.  ``.git`` is never sent.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

IGNORE_FILES = (".gitignore", ".clustertoolignore")
ALWAYS_IGNORED = (".git",)


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool
    base: str  # folder of the ignore file, relative to the matcher's top ("" for the top)
    text: str  # the pattern as written (for messages and tests)


def _trim(line: str) -> str:
    """Trailing spaces go unless escaped with a backslash."""
    line = line.rstrip("\n").rstrip("\r")
    end = len(line)
    while end > 0 and line[end - 1] == " " and not (end > 1 and line[end - 2] == "\\"):
        end -= 1
    return line[:end]


def _char_class(glob: str, i: int) -> tuple[str, int]:
    """The regex of the bracket expression starting at glob[i] == "[" and the index after it."""
    j = i + 1
    negate = j < len(glob) and glob[j] in "!^"
    if negate:
        j += 1
    start = j
    if j < len(glob) and glob[j] == "]":  # a leading ] is literal
        j += 1
    while j < len(glob) and glob[j] != "]":
        j += 2 if glob[j] == "\\" else 1
    if j >= len(glob):  # no closing bracket: a literal "["
        return re.escape("["), i + 1
    body = glob[start:j]
    items, k = [], 0
    while k < len(body):
        if body[k] == "\\" and k + 1 < len(body):
            items.append(re.escape(body[k + 1]))
            k += 2
        elif body[k] == "-" and items and k + 1 < len(body):
            items.append("-")
            k += 1
        else:
            items.append(re.escape(body[k]))
            k += 1
    inner = "".join(items)
    return (f"(?!/)[^{inner}]" if negate else f"(?!/)[{inner}]"), j + 1


def translate(glob: str) -> str:
    """The regex (for re.fullmatch on a "/"-separated relative path) of an anchored glob."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**", i):
            before_ok = i == 0 or glob[i - 1] == "/"
            after = i + 2
            if before_ok and after == len(glob):  # trailing "/**" (or a lone "**"): everything
                out.append(".*" if i == 0 else ".+")
                i = after
                continue
            if before_ok and glob.startswith("/", after):  # "**/": zero or more folders
                out.append("(?:.*/)?")
                i = after + 1
                continue
            out.append("[^/]*")  # other "**" are plain stars
            i = after
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            piece, i = _char_class(glob, i)
            out.append(piece)
        elif c == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_line(line: str, base: str = "") -> Rule | None:
    """One line of an ignore file in folder ``base`` (relative to the top) as a Rule, or None."""
    text = _trim(line)
    if not text or text.startswith("#"):
        return None
    negate = text.startswith("!")
    pattern = text[1:] if negate else text
    if pattern.startswith(("\\#", "\\!")):
        pattern = pattern[1:]
    dir_only = pattern.endswith("/") and not pattern.endswith("\\/")
    pattern = pattern.rstrip("/") if dir_only else pattern
    if not pattern:
        return None
    anchored = "/" in pattern
    pattern = pattern.lstrip("/") if anchored else "**/" + pattern
    if not pattern:
        return None
    return Rule(re.compile(translate(pattern), re.DOTALL), negate, dir_only, base, text)


def parse(text: str, base: str = "") -> list[Rule]:
    return [r for r in (parse_line(line, base) for line in text.splitlines()) if r is not None]


def _git_top(folder: str) -> str | None:
    """The top of the git checkout holding ``folder`` (it or a parent has .git), else None."""
    current = folder
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


class Matcher:
    """Decides, for paths under ``root`` ("/"-separated, relative to it), what the rules ignore."""

    def __init__(self, root: str, files: tuple[str, ...] = IGNORE_FILES,
                 always: tuple[str, ...] = ALWAYS_IGNORED):
        self.root = os.path.abspath(root)
        self.files = files
        self.always = set(always)
        top = _git_top(self.root) or self.root
        prefix = os.path.relpath(self.root, top)
        self.prefix = "" if prefix == "." else prefix.replace(os.sep, "/")
        self.top = top
        self._rules: dict[str, list[Rule]] = {}
        self._dirs: dict[str, bool] = {}

    def _folder_rules(self, base: str) -> list[Rule]:
        """Rules of the ignore files in folder ``base`` (relative to the top), read once."""
        if base not in self._rules:
            rules: list[Rule] = []
            for name in self.files:
                path = os.path.join(self.top, base, name)
                try:
                    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                        rules += parse(fh.read(), base)
                except OSError:
                    continue
            self._rules[base] = rules
        return self._rules[base]

    def _rules_for(self, full: str) -> list[Rule]:
        """Every rule that may apply to ``full`` (relative to the top): shallow folders first."""
        parts = full.split("/")[:-1]
        rules = list(self._folder_rules(""))
        for i in range(1, len(parts) + 1):
            rules += self._folder_rules("/".join(parts[:i]))
        return rules

    def _matches(self, full: str, is_dir: bool) -> bool:
        """Whether the rules exclude ``full`` itself (its parents aside)."""
        if full.rsplit("/", 1)[-1] in self.always:
            return True
        verdict = False
        for rule in self._rules_for(full):
            if rule.dir_only and not is_dir:
                continue
            rel = full[len(rule.base) + 1:] if rule.base else full
            if rule.regex.fullmatch(rel):
                verdict = not rule.negate
        return verdict

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether ``rel`` (relative to the root) is left out: by a rule, or as part of a left-out folder."""
        rel = rel.strip("/")
        if not rel:
            return False
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self._dir_ignored("/".join(parts[:i])):
                return True
        return self._matches(self._full(rel), is_dir)

    def _full(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _dir_ignored(self, rel: str) -> bool:
        if rel not in self._dirs:
            self._dirs[rel] = self._matches(self._full(rel), True)
        return self._dirs[rel]

    def keep(self, rel: str, is_dir: bool) -> bool:
        """The copy filter: True for what is sent (the walk prunes left-out folders itself)."""
        return not self.ignored(rel, is_dir)
