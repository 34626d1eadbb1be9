"""How `--help` names arguments and option values: as users type them, the same with any typer.

Recent typer prints required arguments as ``{src}`` and values as ``<str>``/``<list[str]>``; older
ones as ``SRC``/``TEXT``.  ``name_params`` fixes the wording once, for every command and
subcommand: an argument reads as its metavar, as written (``SRC``, ``-- COMMAND...``, ``[JOB]``), else
its name in capitals (in brackets when optional, ``...`` when it takes several); an option's value reads as
its metavar, else as the option's name in capitals (``--timeout TIMEOUT``); choices stay choices.
"""

from __future__ import annotations

import types
from typing import Any


def argument_label(param: Any) -> str:
    """A metavar as written (it says itself whether it is optional); else NAME, [NAME], NAME..."""
    if param.metavar:
        return param.metavar
    label = (param.name or "").upper()
    label = label if param.required else f"[{label}]"
    return label + "..." if param.nargs != 1 else label


def _usage_pieces(self: Any, ctx: Any) -> list[str]:
    return [argument_label(self)]


def _help_record(self: Any, ctx: Any) -> tuple[str, str]:
    text = (getattr(self, "help", None) or "").strip()
    return argument_label(self).strip("[]"), text


def _is_choice(param: Any) -> bool:
    if type(getattr(param, "type", None)).__name__ == "Choice":
        return True
    return bool(getattr(getattr(param, "type_descriptor", None), "is_choice", False))


def _value_name(param: Any) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    return (max(longs, key=len)[2:] if longs else param.name or "value").replace("-", "_").upper()


def name_params(command: Any) -> None:
    """Readable names for the arguments and option values of ``command`` and its subcommands.

    Works on click's and on typer's own (bundled click) parameters alike, by their kind.
    """
    for param in command.params:
        kind = getattr(param, "param_type_name", "")
        if kind == "argument":
            param.get_usage_pieces = types.MethodType(_usage_pieces, param)
            param.get_help_record = types.MethodType(_help_record, param)
        elif kind == "option" and not (param.is_flag or param.count or param.metavar or _is_choice(param)):
            param.metavar = _value_name(param)
    for sub in getattr(command, "commands", {}).values():
        name_params(sub)
