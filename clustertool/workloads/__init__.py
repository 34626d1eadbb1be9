"""Workloads shipped with clustertool (plain scripts, run on the nodes by mpirun)."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

DIR = Path(__file__).resolve().parent


def node_python() -> list[str]:
    """A Python command that nodes sharing this machine's software can run, with this environment's packages.

    Usually this interpreter itself.  Local nodes have a private home directory, so an
    interpreter installed under the user's home (pyenv, conda) is invisible to them: then
    the system interpreter of the same version with this environment's site-packages.
    """
    exe = os.path.realpath(sys.executable)
    home = os.path.realpath(os.path.expanduser("~"))
    if not exe.startswith(home + os.sep):
        return [sys.executable]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = os.path.join(folder, version)
        if os.access(candidate, os.X_OK):
            return ["env", f"PYTHONPATH={sysconfig.get_paths()['purelib']}", candidate]
    return [sys.executable]
