"""Stand-ins for nvidia-smi, journalctl, dcgmi and fi_info, for machines with no GPU and no EFA.

Each is a small shell program that replays a recording (tests/unit/data/gpu-h100-recorded: real;
gpu-faulty-derived: derived from the documented formats) or, for the time-box tests, sleeps
forever. They stand in for the real programs only: doctor's node programs, time boxes, parsers
and findings are the real ones. Put the folder first on a node's PATH.
"""

from __future__ import annotations

import shlex
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "unit" / "data"
REAL = DATA / "gpu-h100-recorded"
DERIVED = DATA / "gpu-faulty-derived"
HANG = "hang"   # a stand-in that never answers


def _program(name: str, body: str) -> str:
    return f"#!/bin/sh\n# stand-in for {name} (clustertool tests): replays a recording\n{body}\n"


def _replay(path: str, pidfile: str = "") -> str:
    """Print the recording; a hanging one writes its pid to ``pidfile`` first, so a test can see it stopped."""
    if path == HANG:
        return (f"echo $$ > {shlex.quote(pidfile)}\n" if pidfile else "") + "exec sleep 100000"
    return f"exec cat {shlex.quote(path)}"


def write(folder: Path, *, xml: Path, journal: Path | None = None, dcgm: Path | str | None = None,
          fi_info: Path | None = None, seen_as: str | None = None) -> list[str]:
    """Write the stand-ins and their recordings into ``folder``; ``seen_as``: the folder's path as the
    node sees it (a local node sees its private /root elsewhere on this machine). Returns the names."""
    folder.mkdir(parents=True, exist_ok=True)
    there = seen_as or str(folder)

    def copy(src: Path | str | None) -> str:
        if src is None or src == HANG:
            return str(src or "")
        src = Path(src)
        (folder / src.name).write_bytes(src.read_bytes())
        return f"{there}/{src.name}"

    smi = copy(xml)
    programs = {"nvidia-smi": _program("nvidia-smi", "\n".join([
        'case "$*" in',
        f'  *"-q -x"*) {_replay(smi)} ;;',
        "  *--query-compute-apps*) exit 0 ;;",   # no compute process
        "esac",
        'echo "stand-in nvidia-smi: no recording for: $*" >&2',
        "exit 2"]))}
    if journal is not None:
        programs["journalctl"] = _program("journalctl", _replay(copy(journal)))
    if dcgm is not None:
        programs["dcgmi"] = _program("dcgmi", _replay(copy(dcgm), f"{there}/dcgmi.pid"))
    if fi_info is not None:
        programs["fi_info"] = _program("fi_info", _replay(copy(fi_info)))
    for name, text in programs.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return sorted(programs)
