"""pyproject's mypy settings name real modules, and the layers named strict stay strict.

mypy's ``warn_unused_configs`` reports an override entry that matches no module (per entry, also
one of several in a list), but as a note: mypy still says "Success" and exits 0, so ``make lint``
would pass over it. This test makes a stale entry a failure: every ``clustertool...`` entry of
``[[tool.mypy.overrides]]`` must be a module or a package of clustertool/, and a ``.*`` glob must
name a package. It also resolves each module's settings the way mypy does (a concrete name before
a longer glob before a shorter one) and checks the packages named strict are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clustertool"
MYPY = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
OVERRIDES: list[dict] = MYPY.get("overrides", [])

# Every function annotated (disallow_untyped_defs) and every body checked here (house issue 32).
STRICT = ("clustertool.core", "clustertool.cluster", "clustertool.remote", "clustertool.jobs",
          "clustertool.providers.base", "clustertool.api", "clustertool.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _entries(section: dict) -> list[str]:
    module = section["module"]
    return [module] if isinstance(module, str) else list(module)


def stale(entry: str, modules: set[str] = set(MODULES), packages: set[str] = PACKAGES) -> str | None:
    """Why an override entry for clustertool names nothing real, or None when it does."""
    if entry.endswith(".*"):
        prefix = entry[:-2]
        if "*" in prefix:
            return f"{entry}: only a trailing package glob (a.b.*) is used here"
        if prefix not in packages:
            return f"{entry}: {prefix} is not a package" + (" (a module: name it without .*)"
                                                             if prefix in modules else "")
        return None
    if "*" in entry:
        return f"{entry}: only a trailing package glob (a.b.*) is used here"
    return None if entry in modules else f"{entry}: no such module"


def setting(module: str, option: str, overrides: list[dict] = OVERRIDES) -> object:
    """``option`` for ``module`` as mypy resolves it: the section naming the module itself, else the
    longest glob that matches it (``a.b.*`` matches ``a.b`` and everything under it), else the
    global value."""
    best: tuple[int, object] | None = None
    for section in overrides:
        if option not in section:
            continue
        for entry in _entries(section):
            if entry == module:
                rank = 1 << 16
            elif entry.endswith(".*") and (module == entry[:-2] or module.startswith(entry[:-1])):
                rank = len(entry)
            else:
                continue
            if best is None or rank > best[0]:
                best = (rank, section[option])
    return best[1] if best else MYPY.get(option, False)


def test_mypy_warns_on_unused_sections_and_checks_the_package():
    assert MYPY.get("warn_unused_configs") is True
    assert MYPY["files"] == ["clustertool"]


def test_the_stale_finder_finds_stale_entries():
    assert stale("clustertool.core.model") is None and stale("clustertool.core.*") is None
    assert stale("clustertool.*") is None and stale("clustertool.api") is None
    assert stale("clustertool.model") == "clustertool.model: no such module"   # moved to core/ in the layers
    assert "not a package" in stale("clustertool.nosuch.*")
    assert "a module: name it without .*" in stale("clustertool.core.model.*")
    assert "trailing package glob" in stale("clustertool.*.model")


def test_every_mypy_override_names_a_real_module_or_package():
    found = [why for section in OVERRIDES for entry in _entries(section)
             if entry.split(".")[0] == "clustertool" and (why := stale(entry))]
    assert found == [], "stale entries in pyproject's [[tool.mypy.overrides]]:\n" + "\n".join(found)


def test_settings_resolve_as_mypy_resolves_them():
    overrides = [{"module": ["a.*"], "x": True}, {"module": ["a.b.*"], "x": False}, {"module": "a.b.c", "x": True}]
    assert setting("a.z", "x", overrides) is True
    assert setting("a.b", "x", overrides) is False and setting("a.b.d", "x", overrides) is False
    assert setting("a.b.c", "x", overrides) is True
    assert setting("ab", "x", overrides) is False   # the global value (unset)

def test_the_layers_named_strict_are_strict():
    named = [m for m in MODULES if any(m == s or m.startswith(s + ".") for s in STRICT)]
    assert "clustertool.core.model" in named and "clustertool.providers.base" in named
    loose = [f"{m}: {option} is off" for m in named for option in ("disallow_untyped_defs", "check_untyped_defs")
             if setting(m, option) is not True]
    assert loose == []
