"""The README's tour, run as written (issue 33): the commands of its "Five minutes on this machine" block, in
order, on a local cluster made the way the README says, from a folder with a `train.py` and a `data.bin`, with
the virtualenv active as `. .venv/bin/activate` leaves it.

One change to what is written: the cluster's name.  Local clusters' namespaces are named after the cluster
and are this machine's, so `demo` would meet any other run's (or the user's own) `demo`; the test's cluster
is `demo` plus this run's mark, in every command alike."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, unique
from tests.local.conftest import local_leftovers

pytestmark = pytest.mark.local
torch = pytest.importorskip("torch", reason="the tour trains with PyTorch (make setup installs it)")

TRAIN = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t[0].item():g}", flush=True)
dist.destroy_process_group()
"""


def tour() -> list[str]:
    """The tour's command lines, as the README shows them (comments off)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Five minutes on this machine"):]
    block = section[section.index("```sh\n") + 6:section.index("```", section.index("```sh\n") + 6)]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def activated(env: dict) -> dict:
    """The environment after `. .venv/bin/activate`."""
    venv = str(Path(sys.executable).parent.parent)
    return dict(env, VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{env.get('PATH', '')}")


def test_the_readme_tour_runs_as_written(ct_env, tmp_path):
    lines = tour()
    assert lines[0] == "clustertool up --provider local --nodes 2 --name demo" and lines[-1].startswith(
        "clustertool down -c demo"), lines
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "data.bin").write_bytes(os.urandom(1 << 20))
    name = unique("demo")
    env = activated(ct_env)
    said: list[tuple[str, subprocess.CompletedProcess]] = []
    try:
        for line in lines:
            words = [name if w == "demo" else w for w in shlex.split(line)]
            assert words[0] == "clustertool"
            proc = subprocess.run(words, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            assert "Traceback" not in proc.stderr and "error:" not in proc.stderr, f"{line}\n{proc.stderr}"
            said.append((" ".join(words[1:2]), proc))
    finally:
        subprocess.run(["clustertool", "down", "-c", name, "--yes"], env=env, capture_output=True, timeout=300)
    assert local_leftovers(name) == []
    out = {cmd: [p for c, p in said if c == cmd] for cmd, _ in said}
    assert {"node-1: node-1", "node-2: node-2"} <= set(out["exec"][0].stdout.splitlines())
    assert len(out["run"]) == 2
    for proc in out["run"]:  # python train.py (mpirun), torchrun train.py: the user's virtualenv on every node
        assert sorted(re.findall(r"rank (\d) of 2: sum 3", proc.stdout)) == ["0", "1"], proc.stdout
        assert "[c10d]" not in proc.stdout + proc.stderr  # node addresses resolve, also as [::] sees them
    jobs = out["jobs"][0].stdout
    assert len(re.findall(r"\bsucceeded\b", jobs)) == 2 and "python train.py" in jobs and "torchrun train.py" in jobs
    assert "rank 0 of 2: sum 3" in out["logs"][0].stdout and "the latest" in out["logs"][0].stderr
