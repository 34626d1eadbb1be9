"""Every playbook shipped in playbooks/ validates against the commands this build has."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertool.cli.play import resolver
from clustertool.core import yamlfile
from clustertool.playbook import load
from clustertool.playbook.steps import KNOWN_COMMANDS

pytestmark = pytest.mark.unit

PLAYBOOKS = sorted((Path(__file__).resolve().parents[2] / "playbooks").glob("*.yaml"))
REQUIRED = {"cluster": "example", "url": "s3://example-bucket/dataset"}


def test_the_shipped_playbooks_are_there():
    names = {p.name for p in PLAYBOOKS}
    assert {"quickstart-local.yaml", "resnet50-synthetic.yaml", "dataset-from-s3.yaml",
            "allreduce-sweep.yaml"} <= names


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_playbook_validates(path):
    declared = yamlfile.loads(path.read_text()).get("vars") or {}
    overrides = {k: REQUIRED.get(k, "placeholder") for k, v in declared.items() if v is None}
    book = load.load(path, overrides, resolver)
    assert book.steps
    for step in book.steps + book.always:
        assert step.argv[: len(step.command)] == list(step.command)


def test_quickstart_ends_with_down_and_reports_scaling():
    book = load.load(Path(PLAYBOOKS[0]).with_name("quickstart-local.yaml"), {}, resolver)
    assert [s.command for s in book.always] == [("down",)]
    scaling = [s for s in book.steps if s.command == ("bench", "scaling")][0]
    assert "--chart" in scaling.argv and "--csv" in scaling.argv


@pytest.mark.parametrize("command", KNOWN_COMMANDS)
def test_every_command_a_step_may_name_is_a_command_of_the_cli(command):
    spec = resolver(tuple(command.split()))
    assert spec.path == tuple(command.split())
    assert all(p.kind in ("option", "flag", "argument") for p in spec.params)
