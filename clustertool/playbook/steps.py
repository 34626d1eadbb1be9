"""What a playbook step may be: the clustertool commands, their keys, and the argv a step becomes.

The CLI describes each command as a ``CommandSpec`` (introspected from click, so the keys are
exactly the command's flags); this module checks a step's values against it and turns them
into an argv.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

# Every command a step may name (groups as "plugin build").  Interactive ones (ssh, attach)
# and play itself are left out on purpose.
KNOWN_COMMANDS = (
    "up", "down", "status", "ls", "hostfile", "stop", "start", "repin", "exec",
    "copy", "sync-s3", "plugin build", "plugin deploy", "plugin status",
    "bench allreduce", "bench compare", "bench scaling", "run", "jobs", "logs", "kill", "doctor",
    "reboot", "clean", "fetch", "inventory", "cordon", "uncordon",
)
GROUPS = sorted({c.split()[0] for c in KNOWN_COMMANDS if " " in c})


@dataclass
class ParamSpec:
    """One flag or positional argument of a command."""

    name: str                       # the key in YAML (underscores)
    kind: str                       # "option" | "flag" | "argument"
    flag: str | None = None         # "--nodes" (options and flags)
    off_flag: str | None = None     # "--no-verify" for --verify/--no-verify
    type: str = "str"               # "str" | "int" | "float" | "bool" | "choice"
    choices: tuple[str, ...] = ()
    multiple: bool = False          # repeatable option or variadic argument
    required: bool = False
    aliases: tuple[str, ...] = ()   # other keys that mean it (e.g. "json" for --json)
    bare_value: str | None = None   # an option that may be given alone (run's --sync): `key: true`


@dataclass
class CommandSpec:
    path: tuple[str, ...]
    params: list[ParamSpec] = field(default_factory=list)

    def lookup(self, key: str) -> ParamSpec | None:
        key = key.replace("-", "_")
        for p in self.params:
            if key == p.name or key in p.aliases:
                return p
        return None

    def keys(self) -> list[str]:
        return [p.name for p in self.params]


Resolver = Callable[[tuple[str, ...]], CommandSpec]  # a command path -> its keys (from the CLI)


def suggest(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class ValueProblem(Exception):
    """A value that does not fit its key; the caller adds the step and key."""


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _scalar(value: Any, param: ParamSpec) -> str:
    if isinstance(value, (dict, list)):
        raise ValueProblem(f"expects a single value, got a {type(value).__name__}")
    if param.type == "int":
        if isinstance(value, bool) or not (isinstance(value, int) or str(value).strip().lstrip("-").isdigit()):
            raise ValueProblem(f"expects an integer, got {value!r}")
        return str(int(str(value).strip()))
    if param.type == "float":
        try:
            if isinstance(value, bool):
                raise ValueError
            return str(float(value)) if not isinstance(value, int) else str(value)
        except (TypeError, ValueError):
            raise ValueProblem(f"expects a number, got {value!r}") from None
    if param.type == "choice" and str(value) not in param.choices:
        raise ValueProblem(f"expects one of {', '.join(param.choices)}, got {value!r}")
    if value is None:
        raise ValueProblem("has no value")
    return str(value).lower() if isinstance(value, bool) else str(value)


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueProblem(f"expects true or false, got {value!r}")


def _flag(param: ParamSpec) -> str:
    assert param.flag is not None, f"{param.name}: every option and flag has one (cli/play.py)"
    return param.flag


def param_argv(param: ParamSpec, value: Any) -> tuple[list[str], list[str]]:
    """(options, positionals) for one key's value."""
    if param.kind == "flag":
        on = as_bool(value)
        if on:
            return [_flag(param)], []
        return ([param.off_flag] if param.off_flag else []), []
    if param.bare_value is not None and isinstance(value, bool):  # `sync: true` is the bare --sync
        return ([_flag(param)] if value else []), []
    values = value if isinstance(value, list) else [value]
    if not param.multiple and isinstance(value, list):
        raise ValueProblem(f"expects a single value, got a list of {len(value)}")
    texts = [_scalar(v, param) for v in values]
    if param.kind == "argument":
        return [], texts
    out: list[str] = []
    for text in texts:
        out += [_flag(param), text]
    return out, []
