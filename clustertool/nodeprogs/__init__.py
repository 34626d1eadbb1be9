"""Programs shipped to nodes: stdlib-only Python (manifest, ops, s3) and shell programs (*.sh).

The Python programs must not import clustertool: a node runs them with whatever python3 it
has.  ``program_text`` prepends their arguments; ``python_command`` is the remote line that
runs them (``program_stream`` + ``stream_command`` when the program keeps reading stdin).
A shell program gets its inputs from a header of assignments that ``shell_script``
puts right after its ``#!`` line, every value through ``shlex.quote`` (a list becomes a bash
array, or with ``args`` the positional parameters), so the files themselves are plain shell
that shellcheck reads (tests/unit/test_shellcheck.py).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Sequence

DIR = Path(__file__).resolve().parent
_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


# Programs made of several files (each importable here on its own), sent as one, in this order.
PARTS = {"relay": ("stream", "extract", "link", "relay"), "manifest": ("stream", "manifest"),
         "survey": ("stream", "link", "manifest"), "supervise": ("procs", "supervise"), "spot": ("procs", "spot"),
         "stacks": ("flightrec", "stacks"),
         "watchhub": ("watchlate", "watchcore", "watchhub", "watchrecord"), "watchnode": ("watchsteps", "watchnode"),
         "gputext": ("watchsteps", "watchnode", "watchlate", "watchcore", "gputext")}


def program_text(name: str, args: dict, lib: Sequence[str] = ()) -> bytes:
    """Source of the node program ``name`` with its arguments prepended (for ssh stdin).

    ``lib``: helper programs whose source goes first, in the same namespace (a node imports nothing);
    programs in ``PARTS`` bring their own parts."""
    source = program_source(name, lib)
    prefix = f"import json\nARGS = json.loads({json.dumps(json.dumps(args))})\n"
    return (prefix + source).encode()


def program_source(name: str, lib: Sequence[str] = ()) -> str:
    """The source of the node program ``name`` (its parts, ``lib`` first) without arguments."""
    return "\n".join((DIR / f"{part}.py").read_text() for part in (*lib, *PARTS.get(name, (name,))))


def python_command() -> str:
    """Remote command that runs a program given on stdin (python3, else python)."""
    return "exec $(command -v python3 || command -v python) -"


def program_stream(name: str, args: dict, lib: Sequence[str] = ()) -> bytes:
    """``program_text`` with its length in front, for ``stream_command`` (stdin stays open after it)."""
    text = program_text(name, args, lib)
    return f"{len(text)}\n".encode() + text


# Reads exactly one length-prefixed program from stdin and runs it as __main__; the rest of stdin
# stays the program's own (for a conversation with the control machine, remote/session.py).
_BOOT = ('import sys;i=sys.stdin.buffer;n=int(i.readline());'
         'exec(compile(i.read(n),"<clustertool>","exec"))')


def stream_command() -> str:
    """Remote command that runs a ``program_stream`` and leaves the rest of stdin to it."""
    return f"exec $(command -v python3 || command -v python) -c {shlex.quote(_BOOT)}"


def _assignment(name: str, value: str | int | Sequence[str], bash: bool) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"shell input {name!r}: use UPPER_CASE names")
    if isinstance(value, (list, tuple)):
        if not bash:
            raise ValueError(f"shell input {name!r}: a list needs a bash program")
        return f"{name}=({' '.join(shlex.quote(str(v)) for v in value)})"
    return f"{name}={shlex.quote(str(value))}"


def shell_script(name: str, args: Sequence[str] = (), **inputs: str | int | Sequence[str]) -> str:
    """The shell program ``nodeprogs/NAME.sh`` with its inputs set in a header after the ``#!`` line."""
    shebang, _, body = (DIR / f"{name}.sh").read_text().partition("\n")
    bash = "bash" in shebang
    header = ["# inputs, set by clustertool:"]
    header += [_assignment(key, value, bash) for key, value in inputs.items()]
    if args:
        header.append("set -- " + " ".join(shlex.quote(str(a)) for a in args))
    return "\n".join([shebang, *header, body])
