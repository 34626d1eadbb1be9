"""The root command and the ONE place that turns errors into a message and an exit code."""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
import traceback
from typing import Any, Protocol, cast

import typer

from clustertool import __version__
from clustertool.cli import usage
from clustertool.core import interrupts
from clustertool.core.errors import Declined, ExitStatus, ToolError


def _click_modules() -> list:
    """The clicks whose exceptions a command may raise: the copy newer typer versions bundle (typer._click,
    its commands), and click itself where typer has no copy or a module of ours imported it (cli/up.py's
    commands): not imported for a command that does not use it."""
    try:
        from typer import _click as bundled  # typer >= 0.20 ships its own click
    except ImportError:
        import click

        return [click]
    return [bundled] + ([sys.modules["click"]] if "click" in sys.modules else [])


def _classes(name: str, *extra: type[BaseException]) -> tuple[Any, ...]:
    """click's exception classes of that name (Any: found by name, from click and typer's copy alike)."""
    found = [getattr(m.exceptions, name, None) for m in _click_modules()]
    return tuple(dict.fromkeys([c for c in found if c is not None] + list(extra)))


# Asked when an exception is matched (an except clause's expression is evaluated then), not at import
def _abort() -> tuple[Any, ...]:
    return _classes("Abort", *[c for c in (getattr(typer, "Abort", None),) if c])


def _click_error() -> tuple[Any, ...]:
    return _classes("ClickException")


def _usage_error() -> tuple[Any, ...]:
    return _classes("UsageError")


def _exit() -> tuple[Any, ...]:
    return _classes("Exit", typer.Exit)


app = typer.Typer(
    name="clustertool",
    help=(
        "Bring up, wire, feed and run multi-node GPU training clusters: on AWS, as a local "
        "cluster of real sshd nodes in network namespaces, or on machines you already have."
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


_DEBUG = {"on": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"clustertool {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (never with local variables)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    api_timeout: float = typer.Option(
        None, "--api-timeout", metavar="SECONDS", min=1,
        help="Longest time one cloud API call keeps retrying an endpoint that refuses or does not answer "
             "(default 60; env CLUSTERTOOL_AWS_API_TIMEOUT)."),
) -> None:
    _DEBUG["on"] = debug or bool(os.environ.get("CLUSTERTOOL_DEBUG"))
    if api_timeout:
        os.environ["CLUSTERTOOL_AWS_API_TIMEOUT"] = str(api_timeout)


class CommandGroup(Protocol):
    """A click.Group, or the copy of it that typer >= 0.20 bundles (typer._click): what build() uses."""

    commands: dict[str, Any]

    def add_command(self, cmd: Any, name: str | None = None) -> None: ...

    def invoke(self, ctx: Any) -> Any: ...

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any: ...


# The only wiring: each command and the module whose register(app) adds it (tests/cli/test_lazy_commands.py
# checks this table against what each module adds). A command line that names one imports that module alone.
COMMAND_OF = {
    **dict.fromkeys(["up", "down", "status", "ls", "hostfile", "stop", "start", "repin", "ssh"],
                    "clustertool.cli.cluster"),
    "cordon": "clustertool.cli.cordon", "uncordon": "clustertool.cli.cordon",
    "replace": "clustertool.cli.replace",
    "repair-mounts": "clustertool.cli.sharedfs",
    "recover": "clustertool.cli.recover",
    "exec": "clustertool.cli.exec_",
    "copy": "clustertool.cli.copy", "sync-s3": "clustertool.cli.copy",
    "bench": "clustertool.cli.bench",
    "plugin": "clustertool.cli.plugin",
    "play": "clustertool.cli.play",
    "inventory": "clustertool.cli.inventory",
    **dict.fromkeys(["run", "jobs", "logs", "attach", "kill", "reboot", "clean", "fetch"], "clustertool.cli.jobs"),
    "stacks": "clustertool.cli.stacks",
    "doctor": "clustertool.cli.doctor",
    "autostop": "clustertool.cli.autostop", "cost": "clustertool.cli.autostop",
    "capacity": "clustertool.cli.capacity",
    "top": "clustertool.cli.top",
    "monitoring": "clustertool.cli.monitoring", "metrics": "clustertool.cli.monitoring",
    "report": "clustertool.cli.report",
    "stragglers": "clustertool.cli.stragglers",
}

COMMAND_MODULES = list(dict.fromkeys(COMMAND_OF.values()))  # in the order above: --help's order

_GROUP: dict[frozenset[str], CommandGroup] = {}
_LOADED: dict[str, list[Any]] = {}  # module -> its plain click commands, once register(app) has run


def _past_root_options(argv: list[str]) -> list[str]:
    """A command line's words from its command on (the root's options, --api-timeout's value too, left out)."""
    words = list(argv)
    while words and words[0].startswith("-"):
        words = words[2:] if words[0] == "--api-timeout" else words[1:]
    return words


def _named_command(argv: list[str]) -> str | None:
    """The command word of a command line, or None."""
    words = _past_root_options(argv)
    return words[0] if words else None


def build(argv: list[str] | None = None) -> CommandGroup:
    """The click group: typer commands plus modules' plain click commands.

    Given the command line, only the module of the command it names is imported (COMMAND_OF): a command
    starts without the other 19 modules. Every module where it names none (``--help``), one not in the
    table (click then suggests the near ones), or shell completion asks."""
    modules = list(COMMAND_MODULES)
    if argv is not None and not any(k.endswith("_COMPLETE") for k in os.environ):
        named = COMMAND_OF.get(_named_command(argv) or "")
        if named:
            modules = [named]
    for name in modules:
        if name not in _LOADED:
            module = importlib.import_module(name)
            module.register(app)
            _LOADED[name] = module.click_commands() if hasattr(module, "click_commands") else []
    key = frozenset(_LOADED)
    if key in _GROUP:
        return _GROUP[key]
    group = cast(CommandGroup, typer.main.get_command(app))  # a Typer of several commands gives a group
    for command in (c for commands in _LOADED.values() for c in commands):
        group.add_command(command)
    usage.name_params(group)
    _interrupts_pass_typer(group)
    # `up` first in --help: it is where every session starts
    group.commands = dict(sorted(group.commands.items(), key=lambda kv: kv[0] != "up"))
    _GROUP[key] = group
    return group


def _interrupts_pass_typer(group: CommandGroup) -> None:
    """A command's Ctrl-C reaches run() as interrupts.Interrupted: typer >= 0.28 turns a KeyboardInterrupt into
    a silent exit 130 (no "interrupted" line, and no "job keeps running" from `run --follow`'s own handler when
    the Ctrl-C came a moment before it)."""
    invoke = group.invoke

    def passing(ctx: Any) -> Any:
        try:
            return invoke(ctx)
        except KeyboardInterrupt as exc:
            raise interrupts.Interrupted() from exc

    group.invoke = passing  # type: ignore[method-assign]


def _fail(message: str, hint: str | None, code: int, prefix: str = "error: ") -> int:
    try:
        sys.stderr.write(f"{prefix}{message}\n")
        if hint:
            sys.stderr.write(f"hint: {hint}\n")
        sys.stderr.flush()
    except OSError:  # the terminal is gone (SIGHUP): the exit code still tells
        pass
    return code


def _usage_hint(exc: Any) -> str:
    """What a mistake in the command line gets as its hint: the command's own shape, or the option meant."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "clustertool"
    helped = f"`{path} --help` says more"
    if getattr(exc, "option_name", None) is not None:  # an option that does not exist
        near = difflib.get_close_matches(exc.option_name, list(exc.possibilities or []) or _options(ctx), n=1)
        return (f"did you mean {near[0]}? " if near else "") + f"`{path} --help` lists its options"
    if ctx is None:
        return "run with --help for usage"
    param = getattr(exc, "param", None)
    if param is not None and getattr(param, "opts", None) and type(exc).__name__ == "BadParameter":
        choices = list(getattr(getattr(param, "type", None), "choices", None) or [])
        flag = max(param.opts, key=len)
        if choices:
            return f"e.g. {flag} {choices[0]} (one of: {', '.join(map(str, choices))})"
        return f"`{path} --help` says what {flag} takes"
    usage = ctx.get_usage().strip()
    return f"{usage[len('Usage: '):] if usage.startswith('Usage: ') else usage}  ({helped})"


def _options(ctx: Any) -> list[str]:
    return [o for p in getattr(ctx.command, "params", []) for o in getattr(p, "opts", []) if o.startswith("--")]


def _click_message(exc: Any) -> str:
    """click's message in our words: the option typed, named; no "(Possible options ...)": the hint says it."""
    if getattr(exc, "option_name", None) is not None:
        path = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "clustertool"
        return f"no option {exc.option_name} in `{path}`"
    text = exc.format_message().rstrip(".")
    extra = re.match(r"Got unexpected extra arguments? ?\(?s?\)? \((.*)\)$", text)
    if extra:
        words = extra.group(1).split()
        return f"unexpected extra argument{'s' if len(words) > 1 else ''}: {' '.join(words)}"
    return text


def _command_path(argv: list[str] | None) -> str:
    """The command the user typed (``clustertool copy``), for a hint where an error has none."""
    words, group, path = _past_root_options(argv or []), build(list(argv or [])), ["clustertool"]
    while words and isinstance(getattr(group, "commands", None), dict) and words[0] in group.commands:
        path.append(words[0])
        group = group.commands[words.pop(0)]
    return " ".join(path)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code (no sys.exit), for tests and main().

    SIGTERM and SIGHUP are handled like Ctrl-C for the length of the command (interrupts):
    the command's cleanup runs, and the exit code is 128 + the signal's number."""
    restore = interrupts.install()
    try:
        return _run(argv)
    finally:
        restore()


def _run(argv: list[str] | None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        result = build(words).main(args=words, prog_name="clustertool", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except interrupts.Terminated as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        return _fail(exc.message, exc.hint, exc.exit_code)
    except Declined as exc:  # an answer of no: nothing done, and nothing wrong either
        return _fail(exc.message, exc.hint, int(exc.exit_code), prefix="")
    except ToolError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        hint = exc.hint or f"`{_command_path(words)} --help` says what each option takes"
        return _fail(exc.message, hint, int(exc.exit_code))
    except _abort():
        return _fail("interrupted", None, ExitStatus.INTERRUPTED)
    except (KeyboardInterrupt, interrupts.Interrupted):
        return _fail("interrupted", None, ExitStatus.INTERRUPTED)
    except _click_error() as exc:
        if isinstance(exc, _usage_error()):
            return _fail(_click_message(exc), _usage_hint(exc), exc.exit_code)
        return _fail(exc.format_message(), "run with --help for usage", exc.exit_code)
    except _exit() as exc:
        return exc.exit_code
    except PermissionError as exc:  # a folder of ours this user may not write (CLUSTERTOOL_HOME, a hostfile's)
        if _DEBUG["on"]:
            traceback.print_exc()
        return _fail(f"permission denied: {exc.filename or exc}", "check that this user may write there "
                     "(CLUSTERTOOL_HOME, the hostfile folder), or run as the user who made it", ExitStatus.FAILURE)
    except OSError as exc:  # a path of the user's that cannot be read or written (an output file, a folder)
        if _DEBUG["on"]:
            traceback.print_exc()
        if not exc.filename:
            return _fail(f"internal error: {type(exc).__name__}: {exc}",
                         "re-run with --debug for the traceback and report it", ExitStatus.FAILURE)
        return _fail(f"{exc.filename}: {exc.strerror or exc}", "check that its folder exists and that this user may "
                     "write there", ExitStatus.FAILURE)
    except Exception as exc:  # a bug: one line, traceback only with --debug
        if _DEBUG["on"]:
            traceback.print_exc()
        return _fail(f"internal error: {type(exc).__name__}: {exc}",
                     "re-run with --debug for the traceback and report it", ExitStatus.FAILURE)


def main() -> None:
    sys.exit(run(sys.argv[1:]))
