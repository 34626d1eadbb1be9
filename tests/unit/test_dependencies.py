"""Every third-party module the package imports is a declared dependency: a module-level import
needs a dependency of the bare install (`pip install clustertool`), an import inside a function
(a heavy or optional library loaded on first use) a dependency or an extra. Programs shipped to
nodes (nodeprogs/: stdlib only) and the training workloads (workloads/: run with the node's own
torch) are not imported by the package and are left out."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "clustertool"
SHIPPED = ("nodeprogs", "workloads")


def _declared() -> tuple[set[str], set[str]]:
    """(base dependencies, extras' dependencies) as normalized distribution names."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}

    extras = set().union(*(names(v) for v in project.get("optional-dependencies", {}).values()))
    return names(project["dependencies"]), extras


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports() -> dict[str, set[tuple[str, bool]]]:
    """top-level module name -> {(file, inside a function?)} for every non-stdlib, non-package import."""
    found: dict[str, set[tuple[str, bool]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in SHIPPED:
            continue
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, inside: bool) -> None:
            for child in ast.iter_child_nodes(node):
                names = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                    names = [child.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("clustertool", "__future__"):
                        found.setdefault(top, set()).add((str(rel), inside))
                visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(tree, False)
    return found


IMPORTS = _third_party_imports()
DISTS = metadata.packages_distributions()


def _dists(module: str) -> set[str]:
    return {_norm(d) for d in DISTS.get(module, [])}


def test_the_walk_sees_third_party_imports():
    assert "typer" in IMPORTS and "click" in IMPORTS and "yaml" in IMPORTS
    assert _dists("yaml") == {"pyyaml"}


def test_every_module_level_import_is_a_dependency_of_the_bare_install():
    base, _ = _declared()
    missing = sorted(f"{m} ({', '.join(sorted(f for f, inside in where if not inside))})"
                     for m, where in IMPORTS.items()
                     if any(not inside for _, inside in where) and not _dists(m) & base)
    assert missing == [], "imported at module level but not in [project].dependencies: " + "; ".join(missing)


def test_every_lazy_import_is_a_dependency_or_an_extra():
    base, extras = _declared()
    missing = sorted(m for m in IMPORTS if not _dists(m) & (base | extras) and not _optional(m))
    assert missing == [], "imported but declared nowhere in pyproject.toml: " + ", ".join(missing)


# Imported inside a function, behind a clear error when absent, and deliberately not an extra.
OPTIONAL = {
    "torch": "the GPU proof and plugin check use the node's own PyTorch; Makefile installs it separately",
}


def _optional(module: str) -> bool:
    return module in OPTIONAL and all(inside for _, inside in IMPORTS[module])
