"""The package as users install it: `pip install` of the built wheel into a fresh virtualenv with
no extras, then every command's --help and the Python API's import. The test suite's own
environment has the test extras (moto brings flask, which brings click), so a dependency the
package imports but does not declare passes every other test; here it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.install

# Every command path of the CLI as the installed package builds it, with what its --help printed: one process
# (a process per command took a minute of the suite; an import the wheel lacks fails here all the same).
HELP_OF_EVERY_COMMAND = r"""
import contextlib, io, json
from clustertool.cli.app import build

def walk(cmd, path):
    yield path
    if hasattr(cmd, "commands"):   # a group: click's, or the copy typer bundles
        for name, sub in sorted(cmd.commands.items()):
            if not getattr(sub, "hidden", False):
                yield from walk(sub, path + [name])

top, helps = build(), {}
for path in walk(top, []):
    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown):
            code = top.main(args=[*path, "--help"], prog_name="clustertool", standalone_mode=False)
    except Exception as exc:   # an Exit(0) is --help's end in some commands
        code = getattr(exc, "exit_code", "%s: %s" % (type(exc).__name__, exc))
    helps[" ".join(path)] = shown.getvalue() if code in (0, None) else "failed: %s" % code
print(json.dumps(helps))
"""


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A wheel built from this checkout, installed with its declared dependencies only."""
    tmp = tmp_path_factory.mktemp("wheel")
    # the suite's setuptools builds it where there is one (no download); else pip fetches it
    isolation = ["--no-build-isolation"] if _has("setuptools") else []
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(REPO)])
    wheel = next((tmp / "dist").glob("clustertool-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    return venv


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def _env() -> dict[str, str]:
    """No PYTHONPATH and no checkout on the path: only what the wheel installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = os.environ.get("HOME", "/root")
    return env


def test_every_command_help_runs_from_the_bare_install(bare_venv, tmp_path):
    exe = bare_venv / "bin" / "clustertool"
    top = _run([str(exe), "--help"], cwd=tmp_path, env=_env())   # the installed entry point itself
    assert "up" in top.stdout and "exec" in top.stdout
    assert "Usage: clustertool bench allreduce" in _run([str(exe), "bench", "allreduce", "--help"], cwd=tmp_path,
                                                      env=_env()).stdout
    helps = json.loads(_run([str(bare_venv / "bin" / "python"), "-c", HELP_OF_EVERY_COMMAND], cwd=tmp_path,
                            env=_env()).stdout)
    assert len(helps) > 20 and {"up", "exec", "down", "bench allreduce"} <= set(helps), sorted(helps)
    for path, out in helps.items():
        assert f"Usage: clustertool {path}".rstrip() in out, f"clustertool {path} --help printed no usage:\n{out}"


def test_the_python_api_imports_from_the_bare_install(bare_venv, tmp_path):
    code = "import clustertool; print(clustertool.Cluster.__name__, clustertool.__file__)"
    out = _run([str(bare_venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=_env()).stdout
    name, path = out.split()
    assert name == "Cluster" and str(bare_venv) in path
