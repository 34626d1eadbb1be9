"""The playbook runner: stop at the first failure, always: steps after failure, keep/continue, timeouts.

Steps here are real processes (`sh -c`), standing in for clustertool commands.
"""

from __future__ import annotations

import pytest

from clustertool.core import yamlfile
from clustertool.playbook import load, run
from clustertool.playbook.steps import CommandSpec, ParamSpec

pytestmark = pytest.mark.unit


@pytest.fixture
def sh_steps(monkeypatch):
    """Every step runs `sh -c <its command key>` instead of a clustertool command."""
    monkeypatch.setattr(run, "step_process_argv",
                        lambda step: ["sh", "-c", step.args.get("command", "true")])


def any_command(path):
    """Every command takes one key, `command`: what the stand-in step runs."""
    return CommandSpec(tuple(path), [ParamSpec("command", "option", flag="--command")])


def book(text: str):
    return load.parse(yamlfile.loads(text), "pb.yaml", {}, any_command, {})


def statuses(result):
    return [(o.label, o.status) for o in result.outcomes]


def test_failed_step_stops_the_playbook_and_always_steps_still_run(sh_steps, tmp_path):
    mark = tmp_path / "down-ran"
    result = run.run(book(f"""
steps:
  - {{name: first, exec: {{command: "true"}}}}
  - {{name: breaks, exec: {{command: "echo 'error: disk full on node-3' >&2; exit 4"}}}}
  - {{name: later, exec: {{command: "true"}}}}
always:
  - {{down: {{command: "touch {mark}"}}}}
"""))
    assert statuses(result) == [("step 1 (first)", "ok"), ("step 2 (breaks)", "failed"),
                                ("step 3 (later)", "not run"), ("always step 1 (down)", "ok")]
    assert result.failed_step == "step 2 (breaks)"
    assert result.reason == "error: disk full on node-3"
    assert result.outcomes[1].exit_code == 4
    assert result.exit_code == 1
    assert mark.exists()


def test_on_failure_continue_goes_on_and_succeeds(sh_steps):
    result = run.run(book("""
steps:
  - {exec: {command: "exit 1"}, on_failure: continue}
  - {exec: {command: "true"}}
"""))
    assert [o.status for o in result.outcomes] == ["ignored", "ok"]
    assert result.exit_code == 0


def test_on_failure_keep_skips_down_but_runs_other_always_steps(sh_steps, tmp_path):
    down_mark, report_mark = tmp_path / "down", tmp_path / "report"
    result = run.run(book(f"""
cluster: c1
steps:
  - {{exec: {{command: "exit 2"}}, on_failure: keep}}
always:
  - {{down: {{command: "touch {down_mark}"}}}}
  - {{exec: {{command: "touch {report_mark}"}}}}
"""))
    assert not down_mark.exists() and report_mark.exists()
    assert result.kept_cluster == "c1"
    assert ("always step 1 (down)", "skipped") in statuses(result)


def test_skipped_step_by_when(sh_steps):
    result = run.run(book("steps:\n  - {exec: {command: 'exit 9'}, when: false}\n"))
    assert result.outcomes[0].status == "skipped" and result.exit_code == 0


def test_step_timeout_fails_the_step_with_the_reason(sh_steps):
    result = run.run(book("steps:\n  - {exec: {command: 'sleep 30'}, timeout: 0.5}\n"))
    assert result.outcomes[0].status == "failed"
    assert result.reason.startswith("timed out after")
    assert result.outcomes[0].seconds < 10


def test_failing_always_step_makes_the_playbook_fail(sh_steps):
    result = run.run(book("steps:\n  - exec: {command: 'true'}\nalways:\n  - down: {command: 'exit 1'}\n"))
    assert result.failed_step is None and result.exit_code == 1


def test_progress_events_in_order(sh_steps):
    seen = []
    run.run(book("steps:\n  - exec: {command: 'true'}\n  - {exec: {command: x}, when: false}\n"),
                     on_event=lambda kind, step, outcome: seen.append((kind, step.index, outcome.status)))
    assert seen == [("start", 1, "not run"), ("end", 1, "ok"), ("end", 2, "skipped")]


def test_failure_without_a_down_step_still_tears_down_a_cluster_that_exists(sh_steps, ct_env):
    from clustertool.core import state
    from clustertool.core.model import ClusterRecord

    state.save(ClusterRecord("made-by-up", "local"))
    result = run.run(book("cluster: made-by-up\nsteps:\n  - exec: {command: 'exit 1'}\n"))
    assert statuses(result)[-1] == ("always step 1 (down (on failure))", "ok")
    assert result.outcomes[-1].command == "clustertool down -c made-by-up --yes"


def test_success_without_a_down_step_keeps_the_cluster(sh_steps, ct_env):
    from clustertool.core import state
    from clustertool.core.model import ClusterRecord

    state.save(ClusterRecord("kept", "local"))
    result = run.run(book("cluster: kept\nsteps:\n  - exec: {command: 'true'}\n"))
    assert statuses(result) == [("step 1 (exec)", "ok")]
