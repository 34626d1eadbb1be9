"""Imports run one way: no module of clustertool/ imports (even inside a function) one that imports it back.

The walk is over the source (ast), so it sees every ``import`` statement: at module level and
inside functions.  An import inside a function is for a fast ``--help`` (the CLI's command
modules load the core only when a command runs) or for a heavy optional library (boto3, rich,
matplotlib, yaml); a core module never uses one to reach another clustertool module, so that a
cycle cannot hide there.  Modules loaded by name (the provider registry, the CLI's command list)
are not imports and are not walked.
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
    "clustertool.providers.aws": "the provider's verbs load their modules (and so boto3) on first use",
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


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported clustertool module, inside a function?) for every import statement."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, in_function) for t in _targets(module, child) if t != module)
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
    assert "clustertool.remote.group" in GRAPH["clustertool.cluster.lifecycle"]


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


# The layers, lowest first: a module imports only modules of its own layer or below. A module's
# layer is its longest prefix here. The plugin has two sides: what jobs need (the built and
# deployed files, NCCL's log) sits below jobs; `plugin check`, which runs a job and reads a
# bench, sits above bench.
LAYERS = (
    ("core", ("clustertool.core", "clustertool.nodeprogs", "clustertool.workloads",
              "clustertool.sharedfs.specs", "clustertool.sharedfs.argv")),
    ("remote", ("clustertool.remote",)),
    ("providers", ("clustertool.providers", "clustertool.sharedfs",  # shared fs: made by providers, mounted over ssh
                   "clustertool.slurm")),  # Slurm: config written from the record, started over ssh
    ("cluster", ("clustertool.cluster",)),
    ("transfer", ("clustertool.transfer",)),
    ("plugin files", ("clustertool.plugin.build", "clustertool.plugin.deploy", "clustertool.plugin.remote",
                      "clustertool.plugin.nccl_log", "clustertool.plugin")),
    ("jobs", ("clustertool.jobs",)),
    ("bench", ("clustertool.bench",)),
    ("plugin check", ("clustertool.plugin.check", "clustertool.plugin.check_report")),
    ("doctor", ("clustertool.doctor",)),
    ("playbook", ("clustertool.playbook",)),
    ("api", ("clustertool.api", "clustertool")),
    ("cli", ("clustertool.cli", "clustertool.__main__")),
)


def layer_of(module: str) -> tuple[int, str]:
    best = max(((len(p), i, name) for i, (name, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS"
    return best[1], best[2]


def test_every_module_has_a_layer_and_the_layers_are_folders():
    assert layer_of("clustertool.core.state") == (0, "core")
    assert layer_of("clustertool.plugin.check") == (8, "plugin check")
    assert layer_of("clustertool.plugin.deploy") == (5, "plugin files")
    roots = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"}
    assert roots == {"__init__.py", "__main__.py", "api.py"}, "modules at the package root: " + ", ".join(roots)
    for module in MODULES:
        layer_of(module)


def test_imports_run_down_the_layers():
    upward = sorted(f"{m} ({layer_of(m)[1]}) imports {t} ({layer_of(t)[1]})"
                    for m, targets in GRAPH.items() for t in targets if layer_of(t)[0] > layer_of(m)[0])
    assert upward == [], "imports that point up:\n" + "\n".join(upward)


def test_module_names_are_unique():
    """So every internal import reads the same everywhere, without an alias. The CLI's modules are
    named after the commands users type and nothing imports them; nodeprogs/ are programs run on
    nodes, never imported by the package."""
    names: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py" and not module.startswith(("clustertool.cli.", "clustertool.nodeprogs.")):
            names.setdefault(path.stem, []).append(module)
    assert {n: m for n, m in names.items() if len(m) > 1} == {}
