"""The provider interface is all declared: every provider subclasses providers.base.Provider,
implements the required verbs, and the core reaches providers only through declared hooks
(no getattr/hasattr probing)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from clustertool.core.errors import NotSupported
from clustertool.core.model import ClusterRecord
from clustertool.providers import base

pytestmark = pytest.mark.unit

PACKAGE = Path(base.__file__).resolve().parents[1]
REQUIRED = ("check", "plan", "run_instances", "wait_instances", "query_instances", "stop_instances",
            "start_instances", "terminate_instances")


@pytest.mark.parametrize("name", sorted(base.REGISTRY))
def test_every_registered_provider_subclasses_the_base_and_implements_the_verbs(name):
    cls = base.provider_class(name)
    assert issubclass(cls, base.Provider)
    missing = [verb for verb in REQUIRED if getattr(cls, verb) is getattr(base.Provider, verb)]
    assert missing == [], f"{name} lacks {missing}"
    assert cls.name == name and cls.default_user


def test_an_unsupported_verb_is_a_usage_error_with_a_hint():
    provider = base.provider_class("static")()
    cluster = ClusterRecord(name="c", provider="static", user="u")
    with pytest.raises(NotSupported) as e:
        provider.replace_node(cluster, "node-2")
    assert e.value.hint and e.value.exit_code == 2
    assert provider.topology(cluster) == {} and provider.describe(cluster) == {}
    assert provider.owns_cluster(cluster) is False   # adopted machines: down never terminates them


def test_prices_come_from_the_provider():
    assert base.provider_class("local").hourly_price("", 4, False) == 0.0
    assert base.provider_class("static").hourly_price("", 4, False) is None
    aws = base.provider_class("aws")
    assert aws.hourly_price("p4d.24xlarge", 2, True) is None          # spot: changes by the hour
    each = aws.hourly_price("p4d.24xlarge", 1, False)
    assert each and aws.hourly_price("p4d.24xlarge", 2, False) == pytest.approx(2 * each)


def test_the_core_never_probes_a_provider_with_getattr():
    hooks = {n for n, _ in inspect.getmembers(base.Provider)} | set(base.Provider.__annotations__)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "providers" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                   "hasattr"):
                obj, arg = node.args[0], node.args[1] if len(node.args) > 1 else None
                on_provider = "provider" in ast.unparse(obj).lower() or ast.unparse(obj) == "cls"
                if on_provider and isinstance(arg, ast.Constant) and arg.value in hooks:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id}(..., {arg.value!r})")
    assert found == []
