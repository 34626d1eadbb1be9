"""Shared by the benchmark scripts (not tests): a throw-away clustertool home, whole-process
timing, and the CPU time the nodes of a local cluster use (a cpuacct cgroup).

Scripts put this folder at the END of sys.path (bench/copy.py must not shadow the stdlib's copy).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clustertool"]
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]i?B?|)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M' / '256MiB' / '1G' / '1048576' -> bytes (powers of two)."""
    m = SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 256M, 1G)")
    unit = m.group(2)[:1].upper()
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


def parse_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Home:
    """A throw-away CLUSTERTOOL_HOME: benchmark clusters never touch the user's."""

    def __init__(self, prefix: str):
        self.path = tempfile.mkdtemp(prefix=prefix)
        self.env = dict(os.environ, CLUSTERTOOL_HOME=self.path, CLUSTERTOOL_HOSTFILE_DIR=f"{self.path}/hostfiles",
                        CLUSTERTOOL_NO_SSH_INCLUDE="1")

    def cli(self, *args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
        proc = subprocess.run(CLI + list(args), env=self.env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise SystemExit(f"failed: clustertool {' '.join(args)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    def timed(self, *args: str, check: bool = True, timeout: float = 1800) -> float:
        """Wall seconds of one whole `clustertool` process."""
        t0 = time.monotonic()
        self.cli(*args, check=check, timeout=timeout)
        return time.monotonic() - t0

    def remove(self) -> None:
        subprocess.run(["rm", "-rf", self.path])


def timed_argv(argv: list[str], env: dict, check: bool = True, timeout: float = 1800) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    took = time.monotonic() - t0
    if check and proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv[:4])}...: {proc.stderr.strip()[-500:]}")
    return took


def netns_of(cluster: str) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    return [ln.split()[0] for ln in names if ln.startswith(f"ct-{cluster}-")]


class NodeCpu:
    """CPU seconds used by every process of a local cluster's nodes (a cpuacct cgroup, v1 or v2).

    Independent of what else runs on the machine, unlike wall time: the figure to compare
    when the machine is shared.  ``None`` where no cgroup can be made.
    """

    def __init__(self, cluster: str):
        self.path: Path | None = None
        for base, usage in ((Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage"), (Path("/sys/fs/cgroup"), "cpu.stat")):
            if (base / usage).exists() or (base / "cgroup.controllers").exists():
                path = base / f"ct-bench-{cluster}"
                try:
                    path.mkdir(exist_ok=True)
                except OSError:
                    continue
                self.path, self.usage = path, usage
                break
        if self.path is not None:
            self.enroll(cluster)

    def enroll(self, cluster: str) -> None:
        for ns in netns_of(cluster):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    (self.path / "cgroup.procs").write_text(pid)
                except OSError:
                    pass

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        text = (self.path / self.usage).read_text()
        if self.usage == "cpuacct.usage":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()  # empty once the cluster is down
            except OSError:
                pass


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
