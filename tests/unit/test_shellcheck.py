"""Every shell program shipped to nodes passes shellcheck, and what clustertool sends (the file with
its header of quoted inputs) is still valid shell.

shellcheck is a Debian package the setup installs (`make apt`, APT_PACKAGES): a missing one fails
this test instead of skipping it, so the check cannot silently stop running.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest

from clustertool.cluster.facts import facts_script
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs import scripts
from clustertool.remote import keys

pytestmark = pytest.mark.unit

SHELL_FILES = sorted((Path(__file__).resolve().parents[2] / "clustertool").rglob("*.sh"))
NASTY = "/data/my set 'v2' \"q\" ü; rm -rf /"


def test_the_node_programs_are_there():
    assert {p.name for p in SHELL_FILES} >= {"wire.sh", "facts.sh", "kill.sh", "job_status.sh"}


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shellcheck_passes(path):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: `make apt` installs it (Debian package shellcheck)")
    proc = subprocess.run(["shellcheck", "--format=gcc", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _cluster():
    return ClusterRecord("demo", "local",
                         nodes=[Node("node-1", 1, "10.0.0.1", role="leader", host_keys=["ssh-ed25519 A"])])


QUOTED = "'/data/my set '\"'\"'v2'\"'\"' \"q\" ü; rm -rf /'"


@pytest.mark.parametrize("shell, script, quoted", [
    ("sh", keys.wire_script(_cluster(), "key", "ssh-ed25519 AAAA c", "h slots=1\n"), "PUBLIC='ssh-ed25519 AAAA c'\n"),
    ("sh", keys.unwire_script(_cluster(), "ssh-ed25519 AAAA c"), "MODE=unwire\n"),
    ("sh", facts_script(NASTY, [NASTY, "/scratch"]), f"PLUGIN={QUOTED}\n"),
    ("sh", facts_script(NASTY, [NASTY, "/scratch"]), f"set -- {QUOTED} /scratch\n"),
    ("sh", scripts.kill_script("j1-a", "TERM", 1.5), "TENTHS=15\n"),
    ("sh", scripts.status_script(), "JOB_ENV=CLUSTERTOOL_JOB\n"),
], ids=["wire", "unwire", "facts", "facts-args", "kill", "job_status"])
def test_a_program_with_its_inputs_is_valid_shell_and_quotes_them(shell, script, quoted):
    assert subprocess.run([shell, "-n"], input=script.encode()).returncode == 0
    lines = script.splitlines()
    assert lines[:2] == [f"#!/bin/{shell}", "# inputs, set by clustertool:"]
    header = list(itertools.takewhile(lambda line: not line.startswith("#"), lines[2:]))  # then the file
    assert quoted.rstrip("\n") in header
