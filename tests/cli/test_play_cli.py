"""`play`, `bench scaling` and `inventory` from the command line: plans, and bad input as one line."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.cli


def _one_line_error(proc, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_dry_run_prints_every_command_and_runs_nothing(ct_env):
    proc = run_cli("play", "playbooks/quickstart-local.yaml", "--dry-run", "--var", "nodes=2",
                   "--var", "sizes=1,2", env=ct_env)
    assert proc.returncode == 0, proc.stderr
    up = ("step 1 (up 2 local nodes): clustertool up --provider local --nodes 2 --slots 1 --reduction-servers 4 "
          "--link-rate 100mbit --name quickstart")
    assert up in proc.stdout
    assert "always step 1 (remove the local cluster): clustertool down --cluster quickstart --yes" in proc.stdout
    assert "bench scaling --nodes 1,2" in proc.stdout
    assert "bench compare --variants mpi,sharded,servers --plugin --nodes 2" in proc.stdout
    assert "--allreduce {}'" in proc.stdout


def test_dry_run_json(ct_env):
    proc = run_cli("play", "playbooks/quickstart-local.yaml", "--dry-run", "--json", env=ct_env)
    data = json.loads(proc.stdout)
    assert data["playbook"] == "quickstart-local" and data["steps"][0]["command"].startswith("clustertool up")


def test_bad_playbook_is_one_line_naming_step_and_key(ct_env, tmp_path):
    book = tmp_path / "bad.yaml"
    book.write_text("steps:\n  - up: {provider: local, nodes: 2}\n  - name: spread\n    copy: {src: /a, dst: /b}\n")
    line = _one_line_error(run_cli("play", str(book), env=ct_env))
    assert line.startswith("error: step 2 (spread): copy has no key 'dst'")


def test_type_error_from_var(ct_env):
    line = _one_line_error(run_cli("play", "playbooks/quickstart-local.yaml", "--var", "nodes=four", env=ct_env))
    assert line == "error: step 1 (up four local nodes): key 'nodes' expects an integer, got 'four'"


def test_malformed_var_and_missing_file(ct_env):
    assert "expected NAME=VALUE" in _one_line_error(run_cli("play", "playbooks/quickstart-local.yaml",
                                                             "--var", "nodes", env=ct_env))
    assert "no such playbook" in _one_line_error(run_cli("play", "nope.yaml", env=ct_env))


def test_bench_scaling_bad_sizes_is_one_line(ct_env):
    line = _one_line_error(run_cli("bench", "scaling", "--nodes", "1,x", "--", "true", env=ct_env))
    assert "expected a comma list of positive node counts" in line


def test_inventory_of_unknown_cluster(ct_env):
    line = _one_line_error(run_cli("inventory", "-c", "nope", env=ct_env), code=1)
    assert "no cluster named 'nope'" in line


def test_run_json_reports_each_step_and_the_failure(ct_env, tmp_path):
    book = tmp_path / "p.yaml"
    book.write_text("steps:\n  - ls\n  - name: no such cluster\n    status: {cluster: nope}\n  - ls\n"
                    "always:\n  - ls\n")
    proc = run_cli("play", str(book), "--json", env=ct_env)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert [(o["label"], o["status"]) for o in data["outcomes"]] == [
        ("step 1 (ls)", "ok"), ("step 2 (no such cluster)", "failed"), ("step 3 (ls)", "not run"),
        ("always step 1 (ls)", "ok")]
    assert data["failed_step"] == "step 2 (no such cluster)"
    assert data["reason"] == "error: no cluster named 'nope'"
    assert "[1/3]" not in proc.stderr  # --json: no progress lines
