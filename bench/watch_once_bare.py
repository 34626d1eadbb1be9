"""One `top --once` reading of this machine alone, made by the real node programs (watchhub on "the leader",
watchnode beside it), without clustertool installed: for a bare GPU machine (bench/record_watch_gpu.sh).

    python3 bench/watch_once_bare.py [--samples N] [--interval S]   # prints the view (JSON)
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

NODEPROGS = Path(__file__).resolve().parents[1] / "clustertool" / "nodeprogs"


def nodeprogs():
    """clustertool/nodeprogs/__init__.py on its own (it needs only the standard library)."""
    spec = importlib.util.spec_from_file_location("ct_nodeprogs", NODEPROGS / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.5)
    a = p.parse_args()
    progs = nodeprogs()
    args = {"mode": "once", "leader": "this-node", "nodes": [["this-node", "127.0.0.1", "leader"]],
            "node_source": progs.program_source("watchnode"), "remote_python": progs.stream_command(),
            "interval": a.interval, "samples": a.samples, "regex": [], "jobs": None}
    done = subprocess.run([sys.executable, "-"], input=progs.program_text("watchhub", args), capture_output=True,
                          timeout=60)
    sys.stdout.write(done.stdout.decode())
    sys.stderr.write(done.stderr.decode())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
