"""The environment a local cluster's ranks get: the user's own.

Local nodes share this machine's files (but for their private /root, /scratch and /tmp), so the
environment the user runs clustertool from, its virtualenv with torch, torchrun and `python`, is the
one their ranks should use: `run` hands every rank this machine's PATH, the virtualenv's bin first,
and VIRTUAL_ENV.  On other providers the image's environment counts (providers/base.py).
"""

from __future__ import annotations

import os
import shutil
from typing import Mapping

from clustertool.providers.base import RankEnvironment

SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def active_virtualenv(environ: Mapping[str, str], prefix: str, base_prefix: str) -> str | None:
    """The virtualenv the user works in: the activated one, else the one clustertool runs from."""
    if environ.get("VIRTUAL_ENV"):
        return os.path.normpath(environ["VIRTUAL_ENV"])
    return os.path.normpath(prefix) if os.path.normpath(prefix) != os.path.normpath(base_prefix) else None


def rank_path(environ: Mapping[str, str], venv: str | None) -> str:
    """This machine's PATH for the ranks: the virtualenv's bin first, no empty (current folder) entries, the
    system folders last where missing."""
    words = [p for p in environ.get("PATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    if venv:
        words = [os.path.join(venv, "bin")] + words
    words += list(SYSTEM_PATH)
    return os.pathsep.join(dict.fromkeys(words))


def user_environment(environ: Mapping[str, str], prefix: str, base_prefix: str) -> RankEnvironment:
    venv = active_virtualenv(environ, prefix, base_prefix)
    env = {"PATH": rank_path(environ, venv)}
    if venv:
        env["VIRTUAL_ENV"] = venv
    python = shutil.which("python", path=env["PATH"]) or shutil.which("python3", path=env["PATH"])
    where = f"the virtualenv {venv}" if venv else "this machine's PATH"
    said = f"{python} ({where}; local nodes share this machine's files)" if python else \
        f"none: no python on this machine's PATH ({where})"
    return RankEnvironment(env, said)
