"""The docs cannot drift from the CLI: every `clustertool ...` command they show parses, every link resolves.

What counts as a command shown (and nothing else, so output excerpts are never taken for one):
- in a fenced block marked ``sh``, ``bash`` or ``shell``: every line (``\\`` continuations joined) whose first
  word is ``clustertool`` (or ends in ``/clustertool``); a line such as ``a && clustertool b | tee log`` is cut at
  ``&&``, ``||``, ``;``, ``|`` and each piece that starts with clustertool is checked;
- in a fenced block marked ``console``: only the lines that start with ``$ `` (the rest is output);
- in prose and tables: an inline code span that starts with ``clustertool `` is checked the same way, except
  that a span of the command path alone (``clustertool copy``) names the command: only the path must exist.
  A span that starts with a command's own name (``run --nodes server-1``, ``bench allreduce --algo servers``)
  is a fragment: each option it names must be an option of that command (its arguments are not counted).
Blocks marked ``text`` (output), ``yaml``, ``python`` ... are not commands. A fence without a language is refused,
so nothing escapes the check by accident.

A command parses as click parses it (``make_context`` on the resolved sub-command, ``resilient_parsing=False``,
nothing run): the command path exists, each option belongs to that command, the number of arguments is right,
a choice is one of its choices. Placeholders stand for any value: ``NAME``, ``JOB``, ``N``, ``SPEC.yaml``,
``NODE...``, ``[JOB]``, ``<anything>``; a lone ``…`` (or ``...``) says "more options here" and is left out.

Also: every relative link resolves (file, and heading anchor in a .md), every file a code span names
(``jobs/launch.py``, ``tests/aws/ec2front.py``) exists, every fence names its language, and the README stays
under 250 lines and links every page of docs/.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHELL_FENCES = {"sh", "bash", "shell"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"^(?:<[^<>]+>|\[?[A-Z][A-Z0-9_]*(?:[.:=-][A-Za-z0-9_]+)*\]?(?:\.\.\.|…)?)$")
ELISIONS = {"…", "..."}
SEPARATORS = {"&&", "||", ";", "|", "&"}
HELP = {"--help", "-h"}
FILE_NAMED = re.compile(r"^[A-Za-z_][\w.-]*(?:/[\w*.-]+)+\.(?:py|sh|c|h|yaml|md|toml)$")


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Shown:
    """A command as a page shows it: where, the words, and whether it is whole (else a fragment in prose)."""

    where: str
    words: tuple[str, ...]
    whole: bool = True  # False: a fragment in prose, its options checked and not its arguments
    span: bool = False  # in prose: `clustertool copy` alone names the command, and only its path is checked


# ---- what a page shows -----------------------------------------------------------------------------------


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the first line inside, lines) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start, body = m.group(2), i + 2, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((m.group(3).lower(), start, body))
        i += 1
    return blocks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks."""
    out, inside, fence = [], False, ""
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m and (not inside or line.strip().startswith(fence)):
            inside, fence = (not inside), m.group(2)
            continue
        if not inside:
            out.append((n, line))
    return out


def split_commands(line: str) -> list[list[str]]:
    """The pieces of one shell line that start with clustertool, as words (a comment is dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    pieces: list[list[str]] = [[]]
    for word in lexer:
        if word in SEPARATORS:
            pieces.append([])
        else:
            pieces[-1].append(word)
    return [p for p in pieces if p and (p[0] == "clustertool" or p[0].endswith("/clustertool"))]


def joined(lines: list[str], first: int) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending, at = "", first
    for n, line in enumerate(lines, first):
        if not pending:
            at = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((at, pending + line))
        pending = ""
    if pending:
        out.append((at, pending))
    return out


def block_commands(lang: str, body: list[str], first: int, name: str) -> list[Shown]:
    shown = []
    for n, line in joined(body, first):
        text = line.strip()
        if lang == "console":
            if not text.startswith("$ "):
                continue  # output
            text = text[2:]
        elif text.startswith("$ "):
            text = text[2:]
        shown += [Shown(f"{name}:{n}", tuple(words)) for words in split_commands(text)]
    return shown


def span_commands(text: str, name: str, commands: set[str]) -> list[Shown]:
    shown = []
    for n, line in prose_lines(text):
        line = line.replace("\\|", "|")  # a pipe inside a table cell
        for span in SPAN.findall(line):
            span = span.strip()
            if span.startswith("clustertool "):
                shown += [Shown(f"{name}:{n}", tuple(w), span=True) for w in split_commands(span)]
            elif span.split(" ", 1)[0] in commands and " -" in span:
                shown.append(Shown(f"{name}:{n}", ("clustertool", *span.split()), whole=False))
    return shown


def shown_commands(path: Path, commands: set[str]) -> list[Shown]:
    text, name = path.read_text(), path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    shown = []
    for lang, first, body in fenced_blocks(text):
        if lang in SHELL_FENCES or lang == "console":
            shown += block_commands(lang, body, first, name)
    return shown + span_commands(text, name, commands)


# ---- does it parse ---------------------------------------------------------------------------------------


def is_placeholder(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(is_placeholder(v) for v in value)
    return isinstance(value, str) and bool(PLACEHOLDER.match(value))


def tolerant(param: Any) -> Any:
    """A copy of a click/typer parameter that takes a placeholder as any value and runs no callback."""
    clone = copy.copy(param)
    clone.callback = None
    strict = clone.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        return value if is_placeholder(value) else strict(ctx, value)

    clone.process_value = process_value
    return clone


def cli_group() -> Any:
    from clustertool.cli.app import build

    return build()


def _root_options(group: Any, words: list[str]) -> list[str]:
    """``words`` after the root's own options (``--debug``, ``--api-timeout S`` ...); refuses an unknown one."""
    takes_value = {o: not getattr(p, "is_flag", False) for p in group.params for o in p.opts}
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] not in HELP:
        option = words[i].split("=", 1)[0]
        if option not in takes_value:
            raise DocCommandError(f"no such option {option!r} for clustertool itself")
        i += 2 if takes_value[option] and "=" not in words[i] else 1
    return words[i:]


def resolve(group: Any, words: list[str]) -> tuple[Any, list[str], list[str]]:
    """(the leaf command, its path, the words left for it)."""
    command, path = group, []
    while hasattr(command, "commands"):
        if not words or words[0] in HELP:
            if path and not words and not getattr(command, "invoke_without_command", False):
                raise DocCommandError(f"'clustertool {' '.join(path)}' needs a sub-command")
            return command, path, words
        name, words = words[0], words[1:]
        if name not in command.commands:
            choices = ", ".join(sorted(command.commands))
            raise DocCommandError(f"no command {' '.join([*path, name])!r} (there are: {choices})")
        command, path = command.commands[name], [*path, name]
    return command, path, words


class DocCommandError(Exception):
    pass


def check(shown: Shown, group: Any = None) -> None:
    """Raise DocCommandError unless ``shown`` parses against today's CLI."""
    group = group if group is not None else cli_group()
    words = [w for w in shown.words[1:] if w not in ELISIONS]
    command, path, rest = resolve(group, _root_options(group, words))
    if not path or HELP & set(rest[: rest.index("--")] if "--" in rest else rest) or (shown.span and not rest):
        return
    options = {o for p in command.params for o in [*p.opts, *p.secondary_opts] if o.startswith("-")}
    if not shown.whole:
        _check_fragment(path, rest, options)
        return
    clone = copy.copy(command)
    clone.params = [tolerant(p) for p in command.params]
    try:
        clone.make_context(" ".join(["clustertool", *path]), list(rest), resilient_parsing=False)
    except Exception as exc:  # click's (or typer's copy of click's) usage errors
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise DocCommandError(f"clustertool {' '.join(path)}: {message}") from None


def _check_fragment(path: list[str], rest: list[str], options: set[str]) -> None:
    for word in rest:
        if word == "--":
            return
        for piece in re.split(r"[\[\]|/]", word):  # [--opt], a|b, --csv/--json-file
            option = piece.split("=", 1)[0]
            if option.startswith("-") and len(option) > 1 and option not in options:
                raise DocCommandError(f"clustertool {' '.join(path)}: no such option {option!r}")


# ---- links -----------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for n, line in prose_lines(path.read_text()):
        for target in LINK.findall(SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                bad.append(f"{path.name}:{n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{path.name}:{n}: {target} (no heading #{anchor} in {dest.name})")
    return bad


def missing_files(path: Path, root: Path = ROOT) -> list[str]:
    """Files a code span names (``cluster/lifecycle.py``, ``tests/aws/ec2front.py``, ``nodeprogs/*.sh``) that
    exist neither from the checkout's top nor under ``clustertool/``: a module moved, and the page did not."""
    bad = []
    for n, line in prose_lines(path.read_text()):
        for span in SPAN.findall(line.replace("\\|", "|")):
            for word in re.split(r"[\s,+()]+", span):
                if FILE_NAMED.match(word) and not any(any(base.glob(word)) for base in (root, root / "clustertool")):
                    bad.append(f"{path.name}:{n}: {word}")
    return bad


# ---- the docs as they are --------------------------------------------------------------------------------


def all_shown() -> list[Shown]:
    commands = set(cli_group().commands)
    return [s for path in doc_files() for s in shown_commands(path, commands)]


def test_the_docs_show_commands_at_all():
    shown = all_shown()
    assert len(shown) > 100, "the extraction found almost no commands: it is broken"
    assert any(s.words[1:3] == ("run", "-c") for s in shown)


def test_every_command_the_docs_show_parses_against_todays_cli():
    group, errors = cli_group(), []
    for shown in all_shown():
        try:
            check(shown, group)
        except DocCommandError as exc:
            errors.append(f"{shown.where}: {' '.join(shown.words)}\n    {exc}")
    assert not errors, "commands in the docs that the CLI refuses:\n" + "\n".join(errors)


def test_every_relative_link_in_the_docs_resolves():
    bad = [b for path in doc_files() for b in broken_links(path)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_file_the_docs_name_exists():
    bad = [b for path in doc_files() for b in missing_files(path)]
    assert not bad, "files the docs name that do not exist (moved? renamed?):\n" + "\n".join(bad)


def test_every_fenced_block_says_its_language():
    bare = [f"{p.name}:{first - 1}" for p in doc_files() for lang, first, _ in fenced_blocks(p.read_text()) if not lang]
    assert not bare, f"fenced blocks without a language (sh, console, text, yaml ...): {bare}"


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    missing = [p.name for p in doc_files()[1:] if f"(docs/{p.name}" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


# ---- the checker itself ----------------------------------------------------------------------------------


def _one(line: str, whole: bool = True) -> Shown:
    return Shown("t", tuple(shlex.split(line)), whole)


@pytest.mark.parametrize("line", [
    "clustertool run -c demo --sync --follow -- python train.py --epochs 1",
    "clustertool logs -c NAME JOB",
    "clustertool up --provider local --nodes N --name NAME",
    "clustertool up -p aws … --shared-fs efs",
    "clustertool copy -c demo --from local data.bin /scratch/data",
    "clustertool cordon node-5 node-6 --reason 'Xid 79 on GPU 3'",
    "clustertool bench allreduce -c rs --algo servers,ring --sizes 64M",
    "clustertool --api-timeout 30 status -c train",
    "clustertool doctor --help",
    "clustertool hostfile --format deepspeed -o PATH",
])
def test_the_checker_takes_good_commands(line):
    check(_one(line))


@pytest.mark.parametrize("line, says", [
    ("clustertool run -c demo --folow -- python train.py", "--folow"),
    ("clustertool exec -c demo --tmeout 2 -- hostname", "--tmeout"),
    ("clustertool stauts -c demo", "stauts"),
    ("clustertool plugin chek", "chek"),
    ("clustertool plugin", "needs a sub-command"),
    ("clustertool copy -c demo only-one-path", "DEST"),
    ("clustertool status -c demo extra", "extra"),
    ("clustertool up --provider gcp", "gcp"),
    ("clustertool fetch -c demo j1", "PATH"),
    ("clustertool up --nodes four", "four"),
    ("clustertool --debugg status", "--debugg"),
])
def test_the_checker_refuses_a_bad_command(line, says):
    with pytest.raises(DocCommandError, match=re.escape(says)):
        check(_one(line))


def test_a_span_naming_a_command_needs_only_its_path():
    check(Shown("t", ("clustertool", "copy"), span=True))
    with pytest.raises(DocCommandError, match="copy"):
        check(Shown("t", ("clustertool", "copy")))  # in a shell block it is a command line: SRC DEST missing
    with pytest.raises(DocCommandError, match="cpoy"):
        check(Shown("t", ("clustertool", "cpoy"), span=True))


def test_a_fragment_in_prose_is_checked_for_its_options_only():
    check(_one("clustertool copy --from local", whole=False))  # SRC and DEST left out: a fragment
    check(_one("clustertool up --retry-until-up [--retry-interval 5m]", whole=False))
    check(_one("clustertool bench scaling --csv/--json-file/--chart", whole=False))
    with pytest.raises(DocCommandError, match="--retry-intervall"):
        check(_one("clustertool up --retry-until-up [--retry-intervall 5m]", whole=False))


PAGE = """\
# Page

Run `clustertool run -c demo --folow -- x` or `copy --form local`; `clustertool/api.py` is a path.

```sh
clustertool up --provider local --nodes 2 --name demo   # a comment, --not-an-option
clustertool plugin build -c rs && clustertool plugin deploy -c rs | tee log
clustertool run -c demo \\
    --follow -- python train.py
```

```console
$ clustertool doctor --bisect
clustertool --this-is-output
```

```text
clustertool output --never-checked
```

## Second heading

[ok](#second-heading) [bad](#nowhere) [file](missing.md) [web](https://example.com/x)
"""


def test_only_commands_are_taken_from_a_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    shown = shown_commands(page, {"run", "copy", "up"})
    lines = [" ".join(s.words) for s in shown]
    assert lines == [
        "clustertool up --provider local --nodes 2 --name demo",
        "clustertool plugin build -c rs",
        "clustertool plugin deploy -c rs",
        "clustertool run -c demo --follow -- python train.py",
        "clustertool doctor --bisect",
        "clustertool run -c demo --folow -- x",
        "clustertool copy --form local",
    ]
    assert [s.whole for s in shown][-2:] == [True, False]
    assert shown[3].where.endswith(":8")  # a continued line is reported at its first line
    errors = []
    for s in shown:
        try:
            check(s)
        except DocCommandError as exc:
            errors.append(str(exc))
    assert len(errors) == 2 and "--folow" in errors[0] and "--form" in errors[1]


def test_broken_links_and_anchors_are_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    bad = broken_links(page)
    assert len(bad) == 2
    assert "#nowhere" in bad[0] and "missing.md" in bad[1]


def test_a_file_named_in_a_span_must_exist(tmp_path):
    (tmp_path / "clustertool" / "jobs").mkdir(parents=True)
    (tmp_path / "clustertool" / "jobs" / "kill.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("`jobs/kill.py` and `jobs/kil.py`, `clustertool/jobs/kill.py`; `~/.clustertool/x.py` is a node's\n")
    assert missing_files(page, root=tmp_path) == ["page.md:1: jobs/kil.py"]


def test_a_heading_anchor_is_githubs():
    assert slug("GPU proof (`make gpu-check`, `bench/nccl_gpu.py`)") == "gpu-proof-make-gpu-check-benchnccl_gpupy"
    assert slug("When a node dies") == "when-a-node-dies"
