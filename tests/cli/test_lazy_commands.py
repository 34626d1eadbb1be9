"""A command line imports the module of the command it names, not the other 19 (cli/app.py's COMMAND_OF):
the table matches what each module adds, every command is still reachable in one process, and --help,
a misspelt command and shell completion still see them all."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import typer

from clustertool.cli import app

pytestmark = pytest.mark.cli


def _added_by(module_name: str) -> set[str]:
    probe = typer.Typer()
    module = importlib.import_module(module_name)
    module.register(probe)
    names = {c.name or c.callback.__name__.lower().replace("_", "-") for c in probe.registered_commands}
    names |= {g.name or g.typer_instance.info.name for g in probe.registered_groups}
    names |= {c.name for c in (module.click_commands() if hasattr(module, "click_commands") else [])}
    return names


def test_the_table_names_each_modules_commands_and_every_command_of_the_cli():
    for module_name in app.COMMAND_MODULES:
        assert _added_by(module_name) == {c for c, m in app.COMMAND_OF.items() if m == module_name}, module_name
    assert set(app.build().commands) == set(app.COMMAND_OF)


def _fresh(argv: list[str]) -> dict:
    """Run the CLI on argv in a new process: its exit code, and which of the CLI's modules it imported."""
    probe = ("import json, sys; from clustertool.cli import app; code = app.run(json.loads(sys.argv[1])); "
             "print(json.dumps({'code': code, 'modules': sorted(m for m in sys.modules if m.startswith("
             "'clustertool.cli.') or m == 'click')}))")
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), stderr=out.stderr)


def test_a_command_imports_its_own_module_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    seen = _fresh(["--debug", "jobs", "-c", "ghost"])
    assert seen["code"] == 1 and "no cluster named 'ghost'" in seen["stderr"]
    others = [m for m in app.COMMAND_MODULES if m != "clustertool.cli.jobs"]
    assert "clustertool.cli.jobs" in seen["modules"] and not set(others) & set(seen["modules"]), seen["modules"]
    if hasattr(typer, "_click"):   # typer's own copy parses: the other click is not loaded for nothing
        assert "click" not in seen["modules"]


def test_help_and_a_misspelt_command_still_see_every_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    seen = _fresh(["jbos"])
    assert seen["code"] == 2 and "jobs" in seen["stderr"]   # click's "did you mean", from the whole table
    assert set(app.COMMAND_MODULES) <= set(seen["modules"])
    shown = subprocess.run([sys.executable, "-m", "clustertool", "--help"], capture_output=True, text=True,
                           timeout=120).stdout
    assert all(name in shown for name in app.COMMAND_OF)


def test_commands_named_one_after_another_in_one_process_all_run(tmp_path, monkeypatch, capsys):
    """The API's and the playbook's way: one process, several command lines, each group has what it names."""
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    assert app.run(["ls", "--json"]) == 0
    assert app.run(["jobs", "-c", "ghost"]) == 1
    assert app.run(["cost", "--help"]) == 0
    group = app.build(["ls"])
    assert {"ls", "jobs", "cost"} <= set(group.commands)
    assert "no cluster named 'ghost'" in capsys.readouterr().err
