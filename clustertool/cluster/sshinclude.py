"""The ``Include`` line in ``~/.ssh/config`` that makes ``ssh <cluster>-leader`` work.

One line per clustertool home (``Include <home>/clusters/*/ssh_config``), under a comment saying who
added it.  It lives exactly as long as the home has clusters: `up` adds it (and says so, with the way
out: ``CLUSTERTOOL_NO_SSH_INCLUDE=1``), `down` of the home's last cluster takes it out.

Never for a home under a folder other users can write (``/tmp``, ``/var/tmp``, a group-writable one) or
that another user owns: once such a home is gone, anyone could make the path again and hand the user's
ssh their own config (a ``ProxyCommand``, a known_hosts).  Each time the file is edited, lines an earlier
clustertool added that point at a home with no clusters left, or at such a folder, are taken out too.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from clustertool.core import state
from clustertool.core.model import Reporter, silent

COMMENT = "# added by clustertool: ssh <cluster>-leader, <cluster>-node-K"
OPT_OUT = "CLUSTERTOOL_NO_SSH_INCLUDE"
_OURS = re.compile(r"^Include (?P<home>\S+)/clusters/\*/ssh_config$")


def config_path() -> Path:
    return Path(os.path.expanduser("~")) / ".ssh" / "config"


def include_line(clusters_dir: Path) -> str:
    return f"Include {clusters_dir}/*/ssh_config"


def unsafe(path: Path) -> str | None:
    """Why another user could make or change what is at ``path`` (None: nobody but root and this user can):
    a folder on the way that others may write, or that another user owns."""
    me = os.getuid()
    for folder in [Path(os.path.abspath(path)), *Path(os.path.abspath(path)).parents]:
        try:
            st = os.stat(folder)
        except OSError:
            continue  # not made yet: its parent decides who may make it
        if st.st_uid not in (0, me):
            return f"{folder} belongs to another user"
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            return f"{folder} is writable by other users"
    return None


def _has_clusters(home: str) -> bool:
    clusters = Path(home) / "clusters"
    return clusters.is_dir() and any(clusters.glob("*.json"))


def tidied(text: str, keep_home: str | None = None) -> tuple[str, list[str]]:
    """``text`` without the Include lines clustertool added (and their comment, and the blank line after) that
    point at a home with no clusters left or at a place others can write; ``keep_home``'s line stays whatever
    its clusters.  Returns the new text and the homes whose lines went."""
    lines, out, gone = text.splitlines(keepends=True), [], []
    i = 0
    while i < len(lines):
        comment = lines[i].strip() == COMMENT
        target = lines[i + 1] if comment and i + 1 < len(lines) else lines[i]
        found = _OURS.match(target.strip())
        home = found.group("home") if found else None
        if home is not None and home != keep_home and (not _has_clusters(home) or unsafe(Path(home))):
            gone.append(home)
            i += 2 if comment else 1
            if i < len(lines) and not lines[i].strip():
                i += 1  # the blank line `up` put after the block
            continue
        out.append(lines[i])
        i += 1
    return "".join(out), gone


def _write(config: Path, text: str) -> None:
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = config.with_name(f".{config.name}.clustertool-{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, config)


def active() -> bool:
    """Whether ``ssh <cluster>-leader`` works for this home's clusters: its Include is in ~/.ssh/config."""
    config = config_path()
    line = include_line(state.clusters_dir())
    if os.environ.get(OPT_OUT) or not config.exists():
        return False
    return line in (x.strip() for x in config.read_text().splitlines())


def install(report: Reporter = silent) -> None:
    """At `up`: the Include of this home (once, said with the way out), stale ones out; a home others could
    make again gets none (said, with what works instead)."""
    if os.environ.get(OPT_OUT):
        return
    home = state.home()
    why = unsafe(home)
    config = config_path()
    existing = config.read_text() if config.exists() else ""
    text, gone = tidied(existing, keep_home=None if why else str(home))
    _said_gone(gone, report)
    line = include_line(state.clusters_dir())
    if why:
        report(f"~/.ssh/config not edited: {why}, so an Include of {home} could one day read another user's "
               f"files; `clustertool ssh -c NAME` works, or a CLUSTERTOOL_HOME of your own")
    elif line not in (x.strip() for x in text.splitlines()):
        text = f"{COMMENT}\n{line}\n\n{text}"
        report(f"added `{line}` to ~/.ssh/config, so `ssh <cluster>-leader` works ({OPT_OUT}=1: leave the file "
               "alone); it goes when this home's last cluster does")
    if text != existing:
        _write(config, text)


def _said_gone(gone: list[str], report: Reporter) -> None:
    for old in gone:
        report(f"~/.ssh/config: took out the Include of {old} (no clusters left there, or others can write there)")


def tidy(report: Reporter = silent) -> None:
    """After `down`: this home's Include out when its last cluster went; stale ones too."""
    config = config_path()
    if os.environ.get(OPT_OUT) or not config.exists():
        return
    existing = config.read_text()
    text, gone = tidied(existing)
    if gone:
        _write(config, text)
        _said_gone(gone, report)
