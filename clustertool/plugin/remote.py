"""Remote shell lines for the native plugin: staging, committing, status, leader builds.

Pure functions returning one shell line each; every path goes through shlex.quote.  Their
output formats are parsed by the functions below them, so the pair is tested together.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable, Sequence

SUM_RE = re.compile(r"^([0-9a-f]{64})\s+\*?(\S+)$")
VERSION_MARK = "clustertool-nccl-plugin "
LDPATH_MARK = "LD_LIBRARY_PATH="


def staging_dir(dest: str, token: str) -> str:
    return f"{dest.rstrip('/')}/.staging-{token}"


def stage_command(dest: str, token: str, files: Sequence[str]) -> str:
    """Unpack the tar.gz on stdin into a staging folder next to DEST and print its sums."""
    stage = shlex.quote(staging_dir(dest, token))
    names = " ".join(shlex.quote(f) for f in files)
    return (f"set -e; rm -rf {stage}; mkdir -p {stage}; tar -xzf - -C {stage}; "
            f"cd {stage}; sha256sum {names}")


def commit_command(dest: str, token: str, files: Sequence[str]) -> str:
    """Move staged files over DEST's (rename: atomic per file), print the sums now in DEST
    and the login environment's LD_LIBRARY_PATH (what mpirun's daemons will see)."""
    d = shlex.quote(dest.rstrip("/"))
    stage = shlex.quote(staging_dir(dest, token))
    moves = "; ".join(f"mv -f {stage}/{shlex.quote(f)} {d}/{shlex.quote(f)}" for f in files)
    names = " ".join(shlex.quote(f) for f in files)
    return (f"set -e; {moves}; rmdir {stage}; cd {d}; sha256sum {names}; "
            f"printf '{LDPATH_MARK}%s\\n' \"${{LD_LIBRARY_PATH:-}}\"")


def abort_command(dest: str, token: str) -> str:
    return f"rm -rf {shlex.quote(staging_dir(dest, token))}"


def status_command(dest: str, files: Sequence[str]) -> str:
    """Sums of whatever of FILES DEST has, and the version string of the net library."""
    d = shlex.quote(dest.rstrip("/"))
    names = " ".join(shlex.quote(f) for f in files)
    net = shlex.quote(files[0])
    return (f"cd {d} 2>/dev/null || exit 0; for f in {names}; do [ -f \"$f\" ] && sha256sum \"$f\"; done; "
            f"grep -a -o '{VERSION_MARK}[0-9A-Za-z.+-]*' {net} 2>/dev/null | head -n 1; true")


def leader_build_command(workdir: str, files: Sequence[str]) -> str:
    """Unpack native/ sources from stdin into WORKDIR, make, and send the artefacts back as
    base64 of a tar.gz on stdout (make's own output goes to stderr)."""
    w = shlex.quote(workdir)
    names = " ".join(shlex.quote(f) for f in files)
    return (f"set -e; rm -rf {w}; mkdir -p {w}; tar -xzf - -C {w}; make -C {w} -j2 1>&2; "
            f"tar -czf - -C {w}/build {names} | base64")


def parse_sums(text: str) -> dict[str, str]:
    """``sha256sum`` lines -> {file name: hex digest}."""
    sums = {}
    for line in text.splitlines():
        m = SUM_RE.match(line.strip())
        if m:
            sums[m.group(2).rsplit("/", 1)[-1]] = m.group(1)
    return sums


def parse_version(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(VERSION_MARK):
            return line[len(VERSION_MARK):].strip() or None
    return None


def parse_ld_path(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(LDPATH_MARK):
            return line[len(LDPATH_MARK):].strip()
    return None


def mismatched(expected: dict[str, str], got: dict[str, str], files: Iterable[str]) -> list[str]:
    """Files whose digest on a node differs from (or is missing against) the build."""
    return [f for f in files if got.get(f) != expected.get(f)]
