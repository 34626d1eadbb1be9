"""A local cluster's nodes as this machine sees them (tests only): their folders, their processes, a
gate a job waits at, and waiting for an event rather than sleeping.

A local node is a set of namespaces on this machine: its /root, /scratch and /tmp are folders under
the cluster's ``nodes_dir``, its processes are this machine's processes (``ip netns pids``).  A test
that reads a node's files or stops one of its processes here does it at once, without a CLI process
per look (seconds each on a loaded machine), so what it waits for is the event itself.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def _state(env: dict, name: str) -> dict:
    return json.loads((Path(env["CLUSTERTOOL_HOME"]) / "clusters" / f"{name}.json").read_text())


def node_dir(env: dict, name: str, node: str) -> Path:
    """The node's folder here: ``home`` is its /root, ``scratch`` its /scratch, ``tmp`` its /tmp."""
    return Path(_state(env, name)["provider_state"]["nodes_dir"]) / node


def address(env: dict, name: str, node: str) -> str:
    return next(n["address"] for n in _state(env, name)["nodes"] if n["name"] == node)


def netns(env: dict, name: str, index: int) -> str:
    return next(ns for ns in _state(env, name)["provider_state"]["netns"] if ns.endswith(f"-{index}"))


def processes(env: dict, name: str, index: int) -> dict[int, list[str]]:
    """pid -> argv of every process of the node (its network namespace)."""
    pids = subprocess.run(["ip", "netns", "pids", netns(env, name, index)], capture_output=True, text=True).stdout
    out = {}
    for pid in map(int, pids.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue  # gone meanwhile
        out[pid] = argv
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def freeze(pids: list[int]) -> list[int]:
    """SIGSTOP ``pids`` (a process that stops taking data, like a stalled disk); returns them for ``thaw``."""
    assert pids, "nothing to freeze"
    signal_all(pids, signal.SIGSTOP)
    return pids


def thaw(pids: list[int]) -> None:
    """SIGCONT: a signal sent while a process was stopped (TERM from an abort) takes effect now."""
    signal_all(pids, signal.SIGCONT)


def wait_for(check: Callable[[], T], what: str, timeout: float = 120, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something true; return that.  ``timeout`` is a deadline for an event
    that must come, generous for a loaded machine, never a duration the test relies on."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


class Gate:
    """A job that runs until the test opens its gate: ``command`` waits for a file in the home of every
    node it runs on; ``open()`` writes that file on those nodes.  The test decides when the job ends,
    not a ``sleep N`` racing the test's own steps on a loaded machine."""

    def __init__(self, env: dict, name: str, nodes: list[str]):
        self.homes = [node_dir(env, name, n) / "home" for n in nodes]
        self.file = f".ct-test-gate-{secrets.token_hex(4)}"
        self.wait = f'until [ -e "$HOME/{self.file}" ]; do sleep 0.1; done'  # shell text, to put in a script
        self.command = ["sh", "-c", self.wait]

    def open(self) -> None:
        for home in self.homes:
            (home / self.file).touch()

    def remove(self) -> None:
        for home in self.homes:
            (home / self.file).unlink(missing_ok=True)
