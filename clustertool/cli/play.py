"""`clustertool play PLAYBOOK.yaml`: run a YAML playbook of clustertool commands."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List

import typer

from clustertool.core.errors import UsageError
from clustertool.playbook.steps import CommandSpec, ParamSpec

if TYPE_CHECKING:  # a fast --help: the playbook runner loads in the command
    from clustertool.playbook.load import Playbook, Step
    from clustertool.playbook.run import Outcome, PlayResult

_TYPES = {"integer": "int", "float": "float", "boolean": "bool", "choice": "choice"}


def _annotation_type(annotation: Any) -> tuple[str, tuple[str, ...]]:
    """typer's vendored click keeps the Python annotation: unwrap Optional/List to a type name."""
    import enum
    import typing

    while typing.get_origin(annotation) is not None:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if not args:
            break
        annotation = args[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "choice", tuple(str(m.value) for m in annotation)
    return {int: "int", float: "float", bool: "bool"}.get(annotation, "str"), ()


def _type_of(param: Any) -> tuple[str, tuple[str, ...]]:
    ptype = getattr(param, "type", None)
    if ptype is not None and getattr(ptype, "name", None):
        return _TYPES.get(ptype.name, "str"), tuple(getattr(ptype, "choices", ()) or ())
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return _annotation_type(descriptor.annotation)
    return "str", ()


def _param_spec(param: Any) -> ParamSpec | None:
    """Describe one click (or typer-vendored click) parameter; duck-typed, as both kinds occur."""
    if param.name in ("help",) or getattr(param, "hidden", False):
        return None
    ptype, choices = _type_of(param)
    if getattr(param, "param_type_name", "") == "argument":
        return ParamSpec(param.name, "argument", type=ptype, choices=choices,
                         multiple=param.nargs == -1, required=param.required)
    longs = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    aliases = tuple(o.lstrip("-").replace("-", "_") for o in longs if o.lstrip("-").replace("-", "_") != param.name)
    if getattr(param, "is_flag", False):
        off = [o for o in param.secondary_opts if o.startswith("--")]
        return ParamSpec(param.name, "flag", flag=longs[0], off_flag=off[0] if off else None, aliases=aliases)
    return ParamSpec(param.name, "option", flag=longs[0], type=ptype, choices=choices,
                     multiple=bool(param.multiple), required=param.required, aliases=aliases,
                     bare_value=getattr(param, "bare_value", None))


def resolver(path: tuple[str, ...]) -> CommandSpec:
    """The command at `path` (e.g. ("plugin", "build")) described for the playbook."""
    from clustertool.cli.app import build

    command: Any = build()  # then its subcommands: click's or typer's bundled ones, duck-typed
    for word in path:
        command = command.get_command(None, word) if hasattr(command, "get_command") else None
        if command is None:  # playbook.steps.KNOWN_COMMANDS names a command the CLI lacks: a bug
            raise LookupError(f"clustertool has no command {' '.join(path)!r}")
    specs = [s for s in (_param_spec(p) for p in command.params) if s is not None]
    return CommandSpec(tuple(path), specs)


def _pass_stderr(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


def _overrides(items: List[str]) -> dict:
    import yaml

    from clustertool.core import yamlfile

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--var {item!r}: expected NAME=VALUE")
        try:
            parsed = yamlfile.loads(value) if value.strip() else ""
        except yaml.YAMLError:
            parsed = value
        out[key.strip()] = parsed if isinstance(parsed, (str, int, float, bool)) else value
    return out


def play(
    playbook: str = typer.Argument(..., metavar="PLAYBOOK.yaml", help="The playbook to run."),
    var: List[str] = typer.Option([], "--var", "-v", metavar="NAME=VALUE", help="Set a variable (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the playbook and print each command; run nothing."),
    json_output: bool = typer.Option(
        False, "--json", help="Print the result as JSON on stdout (step output goes to stderr)."),
) -> None:
    """Run a playbook: YAML steps that are clustertool commands, with variables and always: steps.

    Every step is checked before the first runs. A failed step stops the playbook with its name and
    reason; always: steps (such as down) run after a failure or Ctrl-C too. on_failure: keep on a step
    keeps the cluster for debugging instead. Each step runs as its own clustertool process.
    """
    from clustertool.cli import render
    from clustertool.playbook import load, run

    book = load.load(playbook, _overrides(var), resolver)
    if dry_run:
        _print_plan(book, json_output)
        return
    events = _Progress(len(book.steps), quiet=json_output)
    result = run.run(book, on_event=events, step_stdout=sys.stderr if json_output else None,
                              step_stderr=_pass_stderr, notify=render.info)
    if json_output:
        render.print_json({**render.to_jsonable(result), "report": book.report})
    else:
        _summary(result)
        _report(book.report)
    raise typer.Exit(result.exit_code)


def _report(paths: List[str]) -> None:
    """The playbook's report: files made by its steps; a CSV shown as a table."""
    import csv
    from pathlib import Path

    from clustertool.cli import render

    for path in map(Path, paths):
        if not path.is_file():
            typer.echo(f"report: {path} (not made)")
        elif path.suffix == ".csv":
            rows = list(csv.reader(path.open()))
            if rows:
                render.table(rows[0], rows[1:], title=str(path))
        else:
            typer.echo(f"report: {path} ({path.stat().st_size // 1024 or 1} KiB)")


def _print_plan(book: Playbook, json_output: bool) -> None:
    from clustertool.cli import render

    rows = [(s.label, s.display if s.run else f"skipped (when: {str(s.when).lower()})")
            for s in book.steps + book.always]
    if json_output:
        render.print_json({"playbook": book.name, "vars": {k: v for k, v in book.vars.items()},
                           "steps": [{"step": label, "command": command} for label, command in rows]})
        return
    typer.echo(f"playbook {book.name}: {len(book.steps)} step(s), {len(book.always)} always step(s) (dry run)")
    for label, command in rows:
        typer.echo(f"  {label}: {command}")


class _Progress:
    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet = total, quiet

    def __call__(self, kind: str, step: Step, outcome: Outcome) -> None:
        from clustertool.cli import render

        if self.quiet:
            return
        where = f"[{step.index}/{self.total}]" if step.section == "steps" else "[always]"
        if kind == "start":
            render.info(f"{where} {step.name}: {step.display}")
        elif outcome.status == "ok":
            render.info(f"{where} {step.name}: ok in {outcome.seconds:.1f}s")
        elif outcome.status == "skipped":
            render.info(f"{where} {step.name}: skipped ({outcome.reason})")
        else:
            render.info(f"{where} {step.name}: {outcome.status.upper()} after {outcome.seconds:.1f}s: {outcome.reason}")


def _summary(result: PlayResult) -> None:
    from clustertool.cli import render

    render.table(["step", "status", "seconds", "detail"],
                 [(o.label, o.status, f"{o.seconds:.1f}" if o.status not in ("not run", "skipped") else "",
                   o.reason) for o in result.outcomes],
                 title=f"playbook {result.playbook}: {result.seconds:.1f}s")
    if result.failed_step:
        sys.stderr.write(f"error: playbook stopped at {result.failed_step}: {result.reason}\n")
    if result.kept_cluster:
        sys.stderr.write(f"hint: cluster {result.kept_cluster} kept for debugging; "
                         f"remove it with `clustertool down -c {result.kept_cluster} --yes`\n")


def register(app: typer.Typer) -> None:
    app.command("play")(play)
