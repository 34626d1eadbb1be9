"""plugin / bench allreduce CLI: bad input and missing deploys fail with one clear line."""

from __future__ import annotations

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import run_cli

pytestmark = pytest.mark.cli


@pytest.fixture
def known(ct_env):
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member") for i in (1, 2)]
    state.save(ClusterRecord(name="plug", provider="local", nodes=nodes, status="ready"))
    return ct_env


def _one_error(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1, proc.stderr
    for n in needles:
        assert n in proc.stderr


def test_plugin_env_before_deploy_says_how(known):
    _one_error(run_cli("plugin", "env", "-c", "plug", env=known), "not deployed", "plugin deploy")


def test_bench_allreduce_before_deploy_says_how(known):
    _one_error(run_cli("bench", "allreduce", "-c", "plug", env=known), "not deployed")


def test_bench_allreduce_rejects_unknown_algorithm(known):
    native_deploy = {"deployed": {"dest": "/x", "sha256": "0" * 64}}
    from clustertool.plugin.build import save_record

    save_record("plug", native_deploy)
    proc = run_cli("bench", "allreduce", "-c", "plug", "--algo", "sharded,tree", env=known)
    _one_error(proc, "tree")
    assert proc.returncode == 2


def test_plugin_build_rejects_unknown_place(known):
    proc = run_cli("plugin", "build", "--on", "moon", env=known)
    _one_error(proc, "moon")
    assert proc.returncode == 2


def test_help_mentions_what_the_plugin_replaces_on_aws(known):
    out = run_cli("plugin", "deploy", "--help", env=known).stdout
    assert "EFA" in out and "tuner" in out


def test_plugin_check_before_deploy_says_how(known):
    _one_error(run_cli("plugin", "check", "-c", "plug", env=known), "not deployed", "plugin deploy")


@pytest.mark.parametrize("args,words", [(["--sizes", "64M:1M"], "MIN:MAX"), (["--sizes", "6:6"], "multiple of 4"),
                                        (["--sizes", "lots"], "not a size"), (["-n", "0"], "--iters")])
def test_plugin_check_rejects_bad_input_before_touching_a_node(known, args, words):
    proc = run_cli("plugin", "check", "-c", "plug", *args, env=known)
    _one_error(proc, words)
    assert proc.returncode == 2


def test_plugin_check_help_says_what_it_reports_and_the_gpu_less_fallback(known):
    out = run_cli("plugin", "check", "--help", env=known).stdout
    assert "ABI" in out and "CollNet" in out and "collnet_bench stand-in" in out
