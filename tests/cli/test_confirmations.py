"""Every question the tool asks: an answer of no is a plain "not ..." line (exit 1, nothing done), not an
error or an interruption; Ctrl-C at the question is an interruption (130); no terminal: refused, naming --yes."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import CLI, REPO

pytestmark = pytest.mark.cli


@pytest.fixture
def known(ct_env):
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member") for i in range(1, 4)]
    state.save(ClusterRecord(name="known", provider="local", nodes=nodes, status="ready"))
    return ct_env


def _at_the_question(args: list[str], env: dict, answer: bytes | None) -> subprocess.CompletedProcess:
    """Run the CLI with a terminal for stdin; once it asks, type ``answer`` (None: press Ctrl-C)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(CLI + args, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=REPO)
    os.close(slave)
    asked = b""
    try:
        deadline = time.monotonic() + 60
        while b"[y/N]" not in asked:
            assert proc.poll() is None and time.monotonic() < deadline, "the question never came"
            asked += os.read(proc.stdout.fileno(), 4096)
        if answer is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends
        else:
            os.write(master, answer)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, (asked + out).decode(), err.decode())


QUESTIONS = [
    (["down", "-c", "known"], "not torn down: cluster 'known' is kept", "clustertool down -c known --yes"),
    (["reboot", "-c", "known", "--nodes", "node-2"], "not rebooted: node-2 of 'known' kept running",
     "clustertool reboot -c known --nodes node-2 --yes"),
    (["replace", "-c", "known", "node-3"], "not replaced: node-3 of 'known' kept", "clustertool replace -c known "
                                                                                  "node-3 --yes"),
]


@pytest.mark.parametrize("args,said,unasked", QUESTIONS, ids=[q[0][0] for q in QUESTIONS])
def test_answering_no_says_what_was_not_done_and_exits_1(known, args, said, unasked):
    proc = _at_the_question(args, known, b"n\n")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [said, f"hint: `{unasked}` does it without asking"], proc.stderr
    assert state.exists("known") and len(state.load("known").nodes) == 3


@pytest.mark.parametrize("args,said,unasked", QUESTIONS[:1], ids=["down"])
def test_ctrl_c_at_the_question_is_an_interruption(known, args, said, unasked):
    proc = _at_the_question(args, known, None)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[0] == "error: interrupted"
    assert state.exists("known")


@pytest.mark.parametrize("args,said,unasked", QUESTIONS, ids=[q[0][0] for q in QUESTIONS])
def test_no_terminal_to_ask_on_is_refused_naming_yes(known, args, said, unasked):
    proc = subprocess.run(CLI + args, env=known, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    first, hint = proc.stderr.strip().splitlines()
    assert first.startswith("error: refusing to") and "without --yes" in first, first
    assert hint.startswith(f"hint: `{unasked}` does it without asking"), hint
    assert state.exists("known")


@pytest.mark.parametrize("argv", [["status", "-c", "known"], ["jobs", "-c", "known"], ["exec", "-c", "known", "--",
                                                                                   "hostname"]],
                         ids=["status", "jobs", "exec"])
def test_ctrl_c_inside_any_command_says_interrupted(known, monkeypatch, capsys, argv):
    """typer 0.28 turns a command's KeyboardInterrupt into a silent exit 130; the user still gets the line."""
    from clustertool.cli import app
    from clustertool.cluster.session import ClusterSession

    def pressed(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ClusterSession, "load", pressed)
    assert app.run(argv) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted"]
