"""Imports run one way: no module of clustertool/ imports (even inside a function) one that imports it back.

The walk is over the source (ast), so it sees every ``import`` statement: at module level and
inside functions.  An import inside a function is for a fast ``--help`` (the CLI's command
modules load the core only when a command runs) or for a heavy optional library (boto3, rich,
matplotlib, yaml); a core module never uses one to reach another clustertool module, so that a
cycle cannot hide there.  Modules loaded by name (the provider registry, the CLI's command list)
are not imports and are not walked.

Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so a statement that names
``clustertool.x.y`` imports ``clustertool``, ``clustertool.x`` and ``clustertool.x.y``: a package
whose ``__init__`` imports its own modules is a loop (each of them runs that ``__init__``), and
the walk sees it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "clustertool"

# Core modules allowed to import clustertool modules inside functions, and why.
LAZY_ALLOWED = {
    # `clustertool up --help` builds the aws provider's options without loading its modules
    "clustertool.providers.aws.aws_provider": "the provider's verbs load their modules (and so boto3) on first use",
    # `clustertool run` (issue 35: a job's start as fast as pdsh + torchrun): what only some jobs need
    "clustertool.jobs.launch": "recovery (replace, the cluster spec), reducers, stacks, plugin, Slurm, --sync's copy",
    "clustertool.jobs.jobrequests": "--sync's copy modules, only for a run that syncs",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _known(name: str) -> str | None:
    """The clustertool module an imported dotted name lands in (its longest known prefix)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _targets(module: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for t in (_known(a.name) for a in node.names) if t]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if _is_package(module) else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    out = []
    for alias in node.names:  # `from pkg import sub` imports the submodule pkg.sub
        target = _known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _known(base)
        if target:
            out.append(target)
    return out


def _packages(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module``: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported clustertool module, inside a function?) for every import statement, with the
    packages each import runs on its way (their ``__init__``)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                landed = {p for t in _targets(module, child) for p in (*_packages(t), t)}
                found.extend((t, in_function) for t in sorted(landed) if t != module)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


GRAPH = {m: sorted({t for t, _ in _imports(m)}) for m in MODULES}


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle as a path (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if state.get(nxt) is None and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if state.get(start) is None and (found := walk(start)):
            return found
    return None


def test_the_walk_sees_the_package():
    assert "clustertool.transfer.copy" in MODULES and "clustertool.cli.app" in MODULES
    assert "clustertool.transfer.drive" in GRAPH["clustertool.transfer.copy"]
    assert "clustertool.remote.group" in GRAPH["clustertool.cluster.wiring"]


def test_the_walk_counts_the_packages_an_import_runs():
    # `from clustertool.providers.local import net` runs clustertool/__init__ and providers/__init__
    # and providers/local/__init__ before net
    assert {"clustertool", "clustertool.providers", "clustertool.providers.local",
            "clustertool.providers.local.net"} <= set(GRAPH["clustertool.providers.local.sysops"])
    # so a package whose __init__ imports one of its modules is a loop
    graph = {**GRAPH, "clustertool.providers.local": ["clustertool.providers.local.nodes"]}
    assert _cycle(graph) is not None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert _cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_no_import_cycle_in_clustertool():
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_core_modules_import_clustertool_modules_at_the_top():
    lazy = sorted(f"{m} imports {t} inside a function" for m in MODULES for t, inside in _imports(m)
                  if inside and not m.startswith("clustertool.cli") and m not in LAZY_ALLOWED)
    assert lazy == []


# The layers, lowest first: each package of clustertool/ (and each module at its root) once, in one
# order; a module imports only modules of its own package or of one below.  ``clustertool`` is the
# package's own __init__: importing any module runs it, so it sits under all of them and imports
# nothing (its names load by name on first use).
LAYERS = ("clustertool", "nodeprogs", "workloads", "core", "remote", "providers", "sharedfs", "slurm", "cluster",
          "transfer", "plugin", "jobs", "controller", "bench", "doctor", "watch", "playbook", "api", "cli", "__main__")


def package_of(module: str) -> str:
    """``clustertool.jobs.launch`` -> ``jobs``; ``clustertool.api`` -> ``api``; ``clustertool`` -> itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(module: str) -> int:
    assert package_of(module) in LAYERS, f"{module} is in no layer: add its package to LAYERS"
    return LAYERS.index(package_of(module))


def test_every_package_has_one_layer_and_every_layer_a_package():
    assert len(set(LAYERS)) == len(LAYERS)
    assert {package_of(m) for m in MODULES} == set(LAYERS)
    assert layer_of("clustertool.doctor.plugin_check") > layer_of("clustertool.bench.allreduce")
    assert layer_of("clustertool.plugin.deploy") < layer_of("clustertool.jobs.launch")


def test_the_package_face_imports_nothing():
    assert GRAPH["clustertool"] == []


def test_imports_run_down_the_layers():
    upward = sorted(f"{m} ({package_of(m)}) imports {t} ({package_of(t)})"
                    for m, targets in GRAPH.items() for t in targets if layer_of(t) > layer_of(m))
    assert upward == [], "imports that point up:\n" + "\n".join(upward)


def test_provider_code_reaches_the_rest_only_through_the_declared_hooks():
    """Outside providers/, a provider is its interface (providers/base.py: every hook with its
    default); its own modules are loaded by name through the registry."""
    reach = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if package_of(m) != "providers"
                   for t in targets if t.startswith("clustertool.providers.")
                   and t not in ("clustertool.providers", "clustertool.providers.base"))
    assert reach == []


def test_the_cli_imports_no_provider():
    """cli/ parses, calls the core and renders: what a provider knows reaches it through the core.
    (Its other half, "and no state loading" outside cli/common.py's one helper, comes with the
    typed requests, which move the loading out of cli/: its test belongs there.)"""
    found = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if package_of(m) == "cli"
                   for t in targets if t == "clustertool.providers" or t.startswith("clustertool.providers."))
    assert found == []


def test_cli_loads_no_state():
    """A command opens its session through cli/common.py's one helper (open_session); no other cli/
    module reads the state files or makes a session itself."""
    found = sorted(f"{m} imports {t}" for m, targets in GRAPH.items()
                   if package_of(m) == "cli" and m != "clustertool.cli.common"
                   for t in targets if t in ("clustertool.core.state", "clustertool.cluster.session"))
    assert found == []


def _internal(name: str) -> bool:
    """A dotted name of this repository: clustertool's own, or the tests' (``tests.fakes...``)."""
    return bool(_known(name)) or name == "tests" or name.startswith("tests.")


def _aliases_in(label: str, text: str) -> list[str]:
    """`import clustertool.x as y`, `from clustertool.x import y as z` (also relative, or of tests.*)."""
    out = []
    for node in ast.walk(ast.parse(text, label)):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        internal = isinstance(node, ast.ImportFrom) and (node.level > 0 or _internal(node.module or ""))
        for alias in node.names:
            if alias.asname and (internal or (isinstance(node, ast.Import) and _internal(alias.name))):
                out.append(f"{label}:{node.lineno}: {alias.name} as {alias.asname}")
    return out


def _aliased(module: str) -> list[str]:
    return _aliases_in(module, MODULES[module].read_text())


REPO = PACKAGE.parent
# Beside the package, the code that imports it: the tests, the benchmarks, the API examples.
USERS = sorted(p for folder in ("tests", "bench", "examples") for p in (REPO / folder).rglob("*.py"))


def test_the_alias_finder_finds_aliases():
    assert _aliased("clustertool.core.model") == []
    source = ("import os as o\nimport clustertool.core.state as st\nfrom clustertool.core import nodeset as ns\n"
              "from clustertool.core.model import Node as N\nfrom . import errors as e\nfrom json import dumps as d\n"
              "from tests.fakes.cluster import saved_cluster as sc\nimport tests.fakes.transport as tr\n"
              "from testsuite import x as y\n")
    assert [a.split(": ")[1] for a in _aliases_in("fake.py", source)] == [
        "clustertool.core.state as st", "nodeset as ns", "Node as N", "errors as e",
        "saved_cluster as sc", "tests.fakes.transport as tr"]
    assert _aliases_in("fake.py", "from clustertool.core.model import Node\nimport numpy as np\n") == []


def test_internal_imports_have_no_alias():
    """Every internal name reads the same wherever it is imported (module names are unique for that)."""
    assert [a for m in sorted(MODULES) for a in _aliased(m)] == []


def test_the_tests_benchmarks_and_examples_import_clustertool_with_no_alias():
    """The same rule for the code beside the package, so a name reads the same in a test as in the code."""
    assert len(USERS) > 100 and REPO / "bench" / "launch.py" in USERS
    found = [a for p in USERS for a in _aliases_in(str(p.relative_to(REPO)), p.read_text())]
    assert found == []


def test_module_names_are_unique():
    """So every internal import reads the same everywhere, without an alias. The CLI's modules are
    named after the commands users type and nothing imports them; nodeprogs/ are programs run on
    nodes, never imported by the package."""
    names: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py" and not module.startswith(("clustertool.cli.", "clustertool.nodeprogs.")):
            names.setdefault(path.stem, []).append(module)
    assert {n: m for n, m in names.items() if len(m) > 1} == {}
