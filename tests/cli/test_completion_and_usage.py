"""Shell completion works in a real bash, and every usage line names its arguments as users write them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cli

BIN = Path(sys.executable).parent


def bash_complete(env: dict, words: list[str], script: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), with the completion script loaded."""
    line = " ".join(f"'{w}'" for w in words)
    program = (f"source {script}\n"
               f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
               "_clustertool_completion clustertool\n"
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


@pytest.fixture
def shell_env(ct_env, tmp_path):
    if not shutil.which("bash") or not (BIN / "clustertool").exists():
        pytest.skip("needs bash and the installed clustertool script")
    return dict(ct_env, HOME=str(tmp_path / "home"), PATH=f"{BIN}:{os.environ['PATH']}", SHELL="/bin/bash")


def test_install_completion_for_bash_completes_commands_options_clusters_and_jobs(shell_env, tmp_path):
    home = Path(shell_env["HOME"])
    home.mkdir()
    # typer finds the shell to install for from the process tree: run it from bash, as a user would
    installed = subprocess.run(["bash", "--norc", "-c", "clustertool --install-completion; exit $?"], env=shell_env,
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0 and "bash completion installed" in installed.stdout, installed.stderr
    script = home / ".bash_completions" / "clustertool.sh"
    assert f"source '{script}'" in (home / ".bashrc").read_text()
    assert bash_complete(shell_env, ["clustertool", "lo"], script) == ["logs"]
    assert bash_complete(shell_env, ["clustertool", "plugin", "dep"], script) == ["deploy"]
    assert "--strategy" in bash_complete(shell_env, ["clustertool", "copy", "--str"], script)
    clusters = Path(shell_env["CLUSTERTOOL_HOME"]) / "clusters"
    (clusters / "band" / "jobs").mkdir(parents=True)
    (clusters / "band.json").write_text("{}")
    (clusters / "bench-b.json").write_text("{}")
    assert bash_complete(shell_env, ["clustertool", "status", "-c", "ba"], script) == ["band"]
    for job_id, name in (("j1123-aaaaaa", "train"), ("j1123-bbbbbb", None)):
        (clusters / "band" / "jobs" / f"{job_id}.json").write_text(json.dumps(
            {"id": job_id, "cluster": "band", "command": ["x"], "name": name, "started": 1.0}))
    assert bash_complete(shell_env, ["clustertool", "logs", "-c", "band", "j1123-"], script) == [
        "j1123-aaaaaa", "j1123-bbbbbb"]
    assert bash_complete(shell_env, ["clustertool", "kill", "-c", "band", "tr"], script) == ["train"]


def test_show_completion_prints_the_script_for_the_users_shell(shell_env):
    shown = subprocess.run(["bash", "--norc", "-c", "clustertool --show-completion; exit $?"], env=shell_env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _clustertool_completion clustertool" in shown.stdout


COMMANDS = ["up", "down", "status", "ls", "hostfile", "stop", "start", "repin", "ssh", "exec", "copy", "sync-s3",
            "play", "inventory", "run", "jobs", "logs", "attach", "kill", "reboot", "clean", "fetch", "doctor",
            "bench", "bench scaling", "bench allreduce", "plugin", "plugin build", "plugin deploy", "plugin status",
            "plugin env", "plugin check"]
USAGE = {
    "copy": "SRC DEST", "sync-s3": "s3://BUCKET/PREFIX DEST", "exec": "-- COMMAND...", "run": "-- COMMAND...",
    "bench scaling": "-- COMMAND...", "ssh": "[NODE] [-- COMMAND...]", "logs": "[JOB]", "attach": "[JOB]",
    "kill": "[JOB]", "fetch": "JOB PATH", "play": "PLAYBOOK.yaml", "up": "[SPEC.yaml]",
}


def test_every_usage_line_names_its_arguments_as_users_write_them():
    code = ("import sys\nfrom clustertool.cli.app import run\n"
            f"for c in {COMMANDS!r}:\n    run(c.split() + ['--help'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    usages = [ln for ln in proc.stdout.splitlines() if ln.startswith("Usage:")]
    assert len(usages) == len(COMMANDS)
    for command, usage in zip(COMMANDS, usages):
        tail = usage.split(f"clustertool {command} [OPTIONS]", 1)[1].strip()
        assert tail == USAGE.get(command, "COMMAND [ARGS]..." if command in ("bench", "plugin") else ""), usage
    values = [ln for ln in proc.stdout.splitlines() if re.search(r"<(str|int|float|list\[str\]|path)>", ln)]
    assert values == []  # option values read as names (--timeout TIMEOUT), not as Python types


# What keeps `clustertool --help` fast, asserted as what it imports rather than as a wall-clock bound (which a
# loaded machine breaks; the figure itself: bench/help_time.py).  Third-party packages beyond the CLI framework
# (boto3, rich, fabric, yaml, torch ...) cost tenths of a second each; so do these parts of the standard library.
HELP_THIRD_PARTY = {"click", "typer", "shellingham", "annotated_doc", "typing_extensions"}
HELP_HEAVY_STDLIB = {"asyncio", "ssl", "http", "email", "xml", "multiprocessing", "sqlite3", "urllib.request",
                     "unittest", "pydoc"}
# the packages that do the work: a command imports them when it runs, never to list itself
HELP_WORK_PACKAGES = ("transfer", "jobs", "doctor", "bench", "watch", "plugin", "workloads", "controller")


def test_help_stays_fast_and_loads_no_cloud_sdk_or_rich():
    code = ("import json, sys\nbefore = set(sys.modules)\nfrom clustertool.cli.app import run\n"
            "try:\n    run(['--help'])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(json.dumps(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "--install-completion" in proc.stdout, proc.stderr
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    tops = {m.split(".")[0] for m in loaded}
    third_party = {t for t in tops if t not in sys.stdlib_module_names and t != "clustertool"
                   and not t.startswith("__editable__")}
    assert {"boto3", "botocore", "rich", "fabric"}.isdisjoint(tops), tops
    assert third_party <= HELP_THIRD_PARTY, third_party - HELP_THIRD_PARTY
    assert [m for m in loaded if m in HELP_HEAVY_STDLIB or m.split(".")[0] in HELP_HEAVY_STDLIB] == []
    work = [m for m in loaded if m.split(".")[0] == "clustertool" and m.split(".")[1:2] != []
            and m.split(".")[1] in HELP_WORK_PACKAGES]
    assert work == [], work
