"""The watch hub as a real process on this machine: the leader's sampler beside it, a member that ssh cannot
reach (nothing listens on 127.0.0.2:22 here), and what `top --once` then says about each."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from clustertool import nodeprogs

pytestmark = pytest.mark.unit


def nothing_listens(addr: str, port: int = 22) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((addr, port)) != 0


def test_once_reports_the_leader_and_names_the_unreachable_member(tmp_path):
    if not nothing_listens("127.0.0.2"):
        pytest.skip("something listens on 127.0.0.2:22 here")
    args = {"mode": "once", "leader": "n1", "nodes": [["n1", "127.0.0.1", "leader"], ["n2", "127.0.0.2", "member"]],
            "node_source": nodeprogs.program_source("watchnode"), "remote_python": nodeprogs.stream_command(),
            "interval": 0.3, "samples": 2, "regex": [], "jobs": None, "gpu": False, "connect_s": 5}
    done = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("watchhub", args), capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    view = json.loads(done.stdout)
    nodes = {n["name"]: n for n in view["nodes"]}
    assert nodes["n1"]["state"] == "ok" and nodes["n1"]["cpu"] is not None and nodes["n1"]["gpus"] is None
    assert nodes["n2"]["state"] == "unreachable" and "refused" in (nodes["n2"]["error"] or "").lower()
    assert view["answered"] == 1 and view["jobs"] == []
