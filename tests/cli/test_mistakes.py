"""Every command's bad-input paths, as a new user makes the mistakes (issue 33): each answer is one line under
160 characters that names what was typed, then a `hint:` line, the usage exit code (2) or 1 for a cluster that
is not there, and nothing made.

The first table is every command of the CLI, found by walking it (a new command is walked too): a misspelt
option, a missing or an extra argument, a cluster that does not exist.  The second is bad values: numbers out
of range, misspelt choices, a path that cannot be written, a node the cluster does not have.  Every case is
decided before any SSH (the recorded cluster's addresses answer nothing)."""

from __future__ import annotations

import os

import pytest

from clustertool.cli import app
from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node

pytestmark = pytest.mark.cli


def _commands(group, path=()):
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, path + (name,))
        else:
            yield path + (name,), command


def _walked() -> list[tuple[list[str], int, str]]:
    """(argv, exit code, what the error line must name) for every command of the CLI."""
    cases = []
    for path, command in _commands(app.build()):
        args = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
        required = [p for p in args if p.required]
        has_cluster = any(p.name == "cluster" for p in command.params)
        variadic = any(p.nargs == -1 for p in args)
        needed = [w for p in command.params if getattr(p, "param_type_name", "") == "option" and p.required
                  for w in (max(p.opts, key=len), "1")]  # options the command cannot go without
        cases.append(([*path, "--nodse", "2"], 2, "--nodse"))
        if required:
            label = required[0].metavar or required[0].name.upper()
            cases.append(([*path], 2, label))
        if not variadic:
            given = ["x"] * len(args)
            cases.append(([*path, *needed, *(["-c", "known"] if has_cluster else []), *given, "surplus"], 2, "surplus"))
        if has_cluster and not variadic and path[-1] not in ("sync-s3",):
            cases.append(([*path, "-c", "ghost", *["x"] * len(required)], 1, "'ghost'"))
    return cases


VALUES = [  # (argv, exit code, what the error line must name)
    ("up --provider local --nodes 0 --name x", 2, "--nodes"),
    ("up --provider local --nodes two --name x", 2, "'two'"),
    ("up --provider gcp --nodes 2", 2, "'gcp'"),
    ("up --provider local --nodes 2 --name Bad_Name", 2, "'Bad_Name'"),
    ("up --provider local --nodes 2 --name x --link-rate fast", 2, "--link-rate"),  # the flag, not link_rate
    ("up --provider local --nodes 2 --name x --reduction-servers -1", 2, "--reduction-servers"),
    ("up --provider local --nodes 2 --name x --access both", 2, "'both'"),
    ("up --provider local --nodes 2 --name x --autostop 5x", 2, "'5x'"),
    ("up --provider local --nodes 2 --name x --shared-fs nfs", 2, "'nfs'"),
    ("up no-such-spec.yaml", 2, "no-such-spec.yaml"),
    ("up --provider local --nodes 2 --name known", 2, "'known'"),
    ("exec -c known --timeout 0 -- true", 2, "--timeout 0"),
    ("exec -c known --nodes node-9 -- true", 2, "node-9"),
    ("copy -c known --from laptop a b", 2, "'laptop'"),
    ("copy -c known --strategy fast a b", 2, "--strategy 'fast'"),
    ("run -c known --np 0 -- python t.py", 2, "--np"),
    ("run -c known --np 99 -- python t.py", 2, "--np 99"),
    ("run -c known --per-node 0 -- python t.py", 2, "--per-node"),
    ("run -c known --restarts -1 -- python t.py", 2, "--restarts -1"),
    ("run -c known --hang-timeout 5x -- python t.py", 2, "'5x'"),
    ("run -c known --launcher torchrn -- t.py", 2, "'torchrn'"),
    ("run -c known --replace-wait 1m -- python t.py", 2, "--replace-wait"),
    ("run -c known -x 1A=2 -- python t.py", 2, "'1A=2'"),
    ("run -c known --sync /no/such/folder -- python t.py", 2, "/no/such/folder"),
    ("run -c known --nodes node-9 -- python t.py", 2, "node-9"),
    ("run -c known", 2, "no command"),
    ("logs -c known --tail -1 j1", 2, "--tail -1"),
    ("logs -c known --rank x j1", 2, "'x'"),
    ("stacks -c known --timeout 0 j1", 2, "--timeout 0"),
    ("hostfile -c known --format slurm", 2, "'slurm'"),
    ("hostfile -c known -o /proc/no/such/hostfile", 2, "/proc/no/such/hostfile"),
    ("cordon -c known node-9", 2, "node-9"),
    ("cordon -c known node-1", 2, "node-1"),
    ("autostop -c known 5x", 2, "'5x'"),
    ("replace -c known node-9 --yes", 2, "node-9"),
    ("reboot -c known --nodes node-9 --yes", 2, "node-9"),
    ("reboot -c ghost", 1, "'ghost'"),
    ("doctor -c known --check nonsense", 2, "'nonsense'"),
    ("bench allreduce -c known --sizes 1Q", 2, "'1Q'"),
    ("bench scaling -c known --nodes 0 -- python t.py", 2, "'0'"),
    ("play no-such-playbook.yaml", 2, "no-such-playbook.yaml"),
    ("sync-s3 -c known s3://b/p /d --url-expiry 9d", 2, "9d"),
    ("inventory -c known --format xml", 2, "'xml'"),
    ("cost --since yesterday", 2, "'yesterday'"),
    ("plugin build -c ghost", 1, "'ghost'"),
    ("down -c known", 2, "--yes"),  # no terminal to ask on
    ("ssh -c known -- uptime; df", 2, "uptime; df"),
]


@pytest.fixture
def recorded(ct_env, tmp_path, monkeypatch):
    """A recorded cluster of 3 nodes with 2 slots each (nothing answers at its addresses); the CLI runs in a
    folder of its own, so that a file a mistake wrongly made would be seen."""
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member", slots=2)
             for i in range(1, 4)]
    state.save(ClusterRecord(name="known", provider="local", nodes=nodes, status="ready"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def _everything(root) -> list[tuple[str, float]]:
    """Every file under ``root`` and when it changed; a known cluster's lock file is not counted (any command
    that changes the cluster takes it, and it stays, empty, beside the cluster's record)."""
    return sorted((os.path.join(d, f), os.path.getmtime(os.path.join(d, f))) for d, _, fs in os.walk(root)
                  for f in fs if f != "known.lock")


def _answer(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = app.run(argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if not line.startswith("» ")]


def _assert_shape(argv, code, lines, want_code, names):
    shown = " ".join(argv)
    assert code == want_code, f"{shown}: exit {code}, {lines}"
    assert len(lines) == 2, f"{shown}: {lines}"
    error, hint = lines
    assert error.startswith("error: ") and len(error) < 160, f"{shown}: {error}"
    assert names in error, f"{shown}: the error does not name {names!r}: {error}"
    assert hint.startswith("hint: ") and len(hint) > len("hint: ") + 5, f"{shown}: {hint}"
    assert "Traceback" not in error and "internal error" not in error


@pytest.mark.parametrize("argv,want_code,names", _walked(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_command_answers_a_misspelt_option_a_wrong_argument_count_and_an_unknown_cluster(
        recorded, capsys, argv, want_code, names):
    before = _everything(recorded)
    code, lines = _answer(argv, capsys)
    _assert_shape(argv, code, lines, want_code, names)
    assert _everything(recorded) == before, f"{' '.join(argv)} made or changed files"


@pytest.mark.parametrize("line,want_code,names", VALUES, ids=[v[0] for v in VALUES])
def test_every_bad_value_names_what_was_typed_with_a_hint_and_makes_nothing(recorded, capsys, line, want_code, names):
    argv = line.split() if "; " not in line else [*line.split(" -- ")[0].split(), "--", line.split(" -- ")[1]]
    before = _everything(recorded)
    code, lines = _answer(argv, capsys)
    _assert_shape(argv, code, lines, want_code, names)
    assert _everything(recorded) == before, f"{line} made or changed files"


def test_a_misspelt_option_hints_the_one_meant(recorded, capsys):
    assert _answer(["run", "--folow", "--", "python", "t.py"], capsys)[1] == [
        "error: no option --folow in `clustertool run`", "hint: did you mean --follow? `clustertool run --help` "
                                                         "lists its options"]


def test_several_clusters_known_lists_the_choices_and_a_misspelt_one_is_guessed(recorded, capsys):
    state.save(ClusterRecord(name="newc2", provider="local", status="ready"))
    assert _answer(["status"], capsys) == (2, ["error: several clusters known (known, newc2): say which one",
                                               "hint: add -c known or -c newc2"])
    assert _answer(["status", "-c", "knwon"], capsys)[1] == ["error: no cluster named 'knwon'",
                                                             "hint: did you mean -c known?"]
