"""The provider interface is all declared: every provider subclasses providers.base.Provider,
implements the required verbs, and the core reaches providers only through declared hooks
(no getattr/hasattr probing)."""

from __future__ import annotations

import ast
import inspect
import time
from pathlib import Path

import pytest

from clustertool.core.errors import NotSupported, UsageError
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


def test_every_declared_hook_is_used_by_the_core():
    """A hook that nothing outside providers/ calls is dead weight every provider carries (as
    Provider.reservations(request) was): each declared verb and hook is reached from the core."""
    hooks = {name for name, value in vars(base.Provider).items()
             if not name.startswith("_") and (callable(value) or isinstance(value, classmethod))}
    used = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "providers" not in path.relative_to(PACKAGE).parts:
            used |= {node.attr for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)}
    assert "sweep" in hooks and "reservations" in hooks
    assert sorted(hooks - used) == []


def test_a_provider_without_sweep_or_capacity_says_so_with_a_hint():
    static = base.provider_class("static")()
    cluster = ClusterRecord(name="c", provider="static", user="u", options={"link_rate": "200mbit"})
    request = base.SweepRequest(known=lambda: pytest.fail("a provider without a sweep asks nothing"))
    calls = [lambda: static.sweep(request),
             lambda: static.capacity_offerings(base.CapacityQuery("t", 1, 1), None, None),
             lambda: static.capacity_offer("cb-1", None, None), lambda: static.reservations(None, None)]
    for call in calls:
        with pytest.raises(NotSupported) as e:
            call()
        assert e.value.hint and e.value.exit_code == 2
    with pytest.raises(NotSupported, match="--sweep works for aws and local, not 'static'"):
        static.sweep(request)
    assert static.link_rate(cluster) is None and static.up_waiting(cluster) is None


def test_the_local_provider_says_the_rate_its_links_are_shaped_to():
    local = base.provider_class("local")()
    shaped = ClusterRecord(name="c", provider="local", user="root", options={"link_rate": "200mbit"})
    assert local.link_rate(shaped) == 200_000_000
    assert local.link_rate(ClusterRecord(name="c", provider="local", user="root")) is None
    with pytest.raises(UsageError, match="--any-home is for --provider aws"):
        local.sweep(base.SweepRequest(known=lambda: (set(), set()), any_home=True))


def test_an_aws_up_waiting_for_capacity_is_told_by_status_and_ls():
    from clustertool.cluster.status import waiting

    wait = {"attempt": 2, "phase": "waiting", "next_try": time.time() + 600, "until": time.time() + 3600,
            "interval_s": 300}
    cluster = ClusterRecord(name="c", provider="aws", user="ubuntu", status="provisioning",
                            provider_state={"capacity_wait": wait})
    told = base.provider_class("aws")().up_waiting(cluster)
    assert told is not None and told.record == wait
    assert told.line.startswith("waiting for capacity: attempt 2 found none; next try at ")
    assert waiting(cluster) == told.line and waiting(cluster, short=True) == told.short
    assert told.short.startswith("waiting for capacity (attempt 2, next try at ")
    cluster.status = "ready"  # an up that finished waits for nothing, whatever its state kept
    assert waiting(cluster) is None
