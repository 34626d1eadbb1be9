"""Playbook parsing and checking: every problem is one line that names the step and the key."""

from __future__ import annotations

import pytest

from clustertool.core import yamlfile
from clustertool.core.errors import SpecError
from clustertool.playbook import load
from clustertool.playbook.steps import CommandSpec, ParamSpec

pytestmark = pytest.mark.unit

SPECS = {
    ("up",): CommandSpec(("up",), [
        ParamSpec("spec_file", "argument"),
        ParamSpec("name", "option", flag="--name"),
        ParamSpec("provider", "option", flag="--provider", type="choice", choices=("local", "aws")),
        ParamSpec("nodes", "option", flag="--nodes", type="int"),
    ]),
    ("exec",): CommandSpec(("exec",), [
        ParamSpec("command", "argument", multiple=True, required=True),
        ParamSpec("cluster", "option", flag="--cluster"),
        ParamSpec("nodes", "option", flag="--nodes"),
        ParamSpec("timeout", "option", flag="--timeout", type="float"),
        ParamSpec("json_output", "flag", flag="--json", aliases=("json",)),
    ]),
    ("copy",): CommandSpec(("copy",), [
        ParamSpec("src", "argument", required=True),
        ParamSpec("dest", "argument", required=True),
        ParamSpec("cluster", "option", flag="--cluster"),
        ParamSpec("verify", "flag", flag="--verify", off_flag="--no-verify"),
    ]),
    ("bench", "scaling"): CommandSpec(("bench", "scaling"), [
        ParamSpec("command", "argument", multiple=True, required=True),
        ParamSpec("cluster", "option", flag="--cluster"),
        ParamSpec("env", "option", flag="--env", multiple=True),
        ParamSpec("per_node", "option", flag="--per-node", type="int"),
    ]),
    ("down",): CommandSpec(("down",), [
        ParamSpec("cluster", "option", flag="--cluster"),
        ParamSpec("yes", "flag", flag="--yes"),
    ]),
}


def resolver(path):
    return SPECS[tuple(path)]


def parse(text: str, **overrides):
    return load.parse(yamlfile.loads(text), "pb.yaml", overrides, resolver, {"python": "python3"})


def problem(text: str, **overrides) -> str:
    with pytest.raises(SpecError) as info:
        parse(text, **overrides)
    message = info.value.message
    assert "\n" not in message
    return message


GOOD = """
vars: {cluster: demo, nodes: 4}
cluster: ${cluster}
steps:
  - up: {provider: local, nodes: "${nodes}"}
  - name: hello
    exec: {nodes: leader, command: "echo $${HOME}"}
  - copy: {src: /data, dest: /data, verify: false}
always:
  - down
"""


def test_steps_become_argv_with_cluster_name_and_yes_injected():
    book = parse(GOOD)
    assert [s.argv for s in book.steps] == [
        ["up", "--provider", "local", "--nodes", "4", "--name", "demo"],
        ["exec", "--nodes", "leader", "--cluster", "demo", "--", "echo ${HOME}"],
        ["copy", "--no-verify", "--cluster", "demo", "--", "/data", "/data"],
    ]
    assert book.always[0].argv == ["down", "--cluster", "demo", "--yes"]
    assert book.always[0].label == "always step 1 (down)"


def test_var_override_replaces_declared_value_and_keeps_type():
    book = parse(GOOD, nodes=2)
    assert book.steps[0].argv[:5] == ["up", "--provider", "local", "--nodes", "2"]


def test_unknown_command_names_step_and_suggests():
    msg = problem("steps:\n  - ok: {}\n  - cpoy: {src: a, dest: b}\n")
    assert msg.startswith("step 1: unknown command 'ok'")
    msg = problem("steps:\n  - copy: {src: a, dest: b}\n  - cpoy: {src: a, dest: b}\n")
    assert msg.startswith("step 2: unknown command 'cpoy'") and "did you mean 'copy'" in msg


def test_group_without_subcommand_lists_them():
    msg = problem("steps:\n  - plugin: {}\n")
    assert "step 1" in msg and "plugin build" in msg and "plugin deploy" in msg


def test_unknown_key_names_step_and_key():
    msg = problem("steps:\n  - name: fetch data\n    copy: {src: a, dst: b}\n")
    assert msg.startswith("step 1 (fetch data): copy has no key 'dst'")
    assert "did you mean 'dest'" in msg


def test_type_error_names_step_key_and_value():
    msg = problem("steps:\n  - up: {nodes: four}\n")
    assert msg == "step 1 (up): key 'nodes' expects an integer, got 'four'"
    assert "expects one of local, aws" in problem("steps:\n  - up: {provider: gcp}\n")
    assert "expects a number" in problem("steps:\n  - exec: {command: x, timeout: soon}\n")
    assert "expects true or false" in problem("steps:\n  - copy: {src: a, dest: b, verify: maybe}\n")


def test_type_error_from_a_var_override_is_caught_before_running():
    assert problem(GOOD, nodes="many") == "step 1 (up): key 'nodes' expects an integer, got 'many'"


def test_list_for_single_value_key_is_an_error():
    assert "expects a single value, got a list" in problem("steps:\n  - exec: {command: x, nodes: [a, b]}\n")


def test_repeatable_option_takes_a_list():
    book = parse("steps:\n  - bench scaling: {env: [A=1, B], per_node: 2, command: [python, t.py]}\n")
    assert book.steps[0].argv == ["bench", "scaling", "--env", "A=1", "--env", "B", "--per-node", "2",
                                  "--", "python", "t.py"]


def test_missing_required_key():
    assert problem("steps:\n  - copy: {src: a}\n") == "step 1 (copy): missing required key 'dest' for copy"


def test_undefined_variable_names_step_key_and_variable():
    msg = problem("vars: {data: /d}\nsteps:\n  - copy: {src: '${dta}', dest: /x}\n")
    assert msg.startswith("step 1 (copy): key 'src': variable 'dta' is not defined")
    assert "did you mean 'data'" in msg


def test_required_variable_must_be_given():
    text = "vars: {bucket: null}\nsteps:\n  - exec: {command: 'aws s3 ls ${bucket}'}\n"
    assert "variable 'bucket' has no value: pass --var bucket=VALUE" in problem(text)
    assert parse(text, bucket="s3://b").steps[0].argv[-1] == "aws s3 ls s3://b"


def test_unknown_override_is_an_error():
    assert "--var nodez: the playbook has no such variable (did you mean 'nodes'?)" in problem(GOOD, nodez=3)


def test_when_conditions():
    text = """
vars: {mode: fast, n: 1}
steps:
  - {name: a, exec: {command: x}, when: "${mode} == fast"}
  - {name: b, exec: {command: x}, when: "${n} != 1"}
  - {name: c, exec: {command: x}, when: false}
  - {name: d, exec: {command: x}, when: "${n}"}
"""
    assert [s.run for s in parse(text).steps] == [True, False, False, True]
    assert "cannot read 'maybe' as a condition" in problem("steps:\n  - {exec: {command: x}, when: maybe}\n")


def test_on_failure_and_timeout_are_checked():
    assert "key 'on_failure' expects one of down, keep, continue" in problem(
        "steps:\n  - {exec: {command: x}, on_failure: retry}\n")
    assert "key 'timeout' expects a positive number" in problem("steps:\n  - {exec: {command: x}, timeout: -1}\n")


def test_one_command_per_step():
    assert "names several commands" in problem("steps:\n  - {exec: {command: x}, copy: {src: a, dest: b}}\n")
    assert "names no command" in problem("steps:\n  - {name: nothing}\n")


def test_yes_and_on_keys_stay_words_not_booleans():
    assert yamlfile.loads("a: {on: leader, yes: true, b: yes}") == {"a": {"on": "leader", "yes": True, "b": "yes"}}


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("steps:\n  - exec: {command: a}\nsteps:\n  - exec: {command: b}\n")
    with pytest.raises(SpecError) as info:
        load.load(path, {}, resolver)
    assert info.value.message.startswith(f"{path}:3:") and "duplicate key 'steps'" in info.value.message


def test_top_level_and_shape_errors():
    assert "unknown top-level key 'step'" in problem("step: []\n")
    assert "'steps' must be a non-empty list" in problem("vars: {}\n")
    assert "a playbook is a mapping" in problem("- up\n")


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps:\n  - up: {nodes: 4\n  - down\n")
    with pytest.raises(SpecError) as info:
        load.load(path, {}, resolver)
    assert info.value.message.startswith(f"{path}:") and "malformed YAML" in info.value.message


def test_builtin_python_and_workloads_vars(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("steps:\n  - exec: {command: '${python} ${workloads}/train_mlp.py --steps 1'}\n")
    argv = load.load(path, {}, resolver).steps[0].argv
    assert argv[-1].endswith("clustertool/workloads/train_mlp.py --steps 1")


def test_vars_use_earlier_vars_and_overrides():
    text = "vars: {out: 'results/${cluster}', cluster: qs}\nsteps:\n  - exec: {command: 'ls ${out}'}\n"
    assert parse(text, cluster="big").steps[0].argv[-1] == "ls results/big"
    assert "variable 'cluster' is not defined" in problem(text)
