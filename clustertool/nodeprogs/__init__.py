"""Programs shipped to nodes over ssh stdin: stdlib-only Python (manifest, ops, s3).

The programs must not import clustertool: a node runs them with whatever python3 it has.
``program_text`` prepends their arguments; ``python_command`` is the remote line that runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

DIR = Path(__file__).resolve().parent


def program_text(name: str, args: dict) -> bytes:
    """Source of the node program ``name`` with its arguments prepended (for ssh stdin)."""
    source = (DIR / f"{name}.py").read_text()
    prefix = f"import json\nARGS = json.loads({json.dumps(json.dumps(args))})\n"
    return (prefix + source).encode()


def python_command() -> str:
    """Remote command that runs a program given on stdin (python3, else python)."""
    return "exec $(command -v python3 || command -v python) -"
