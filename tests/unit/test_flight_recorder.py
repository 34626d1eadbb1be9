"""The Flight Recorder beside `stacks`: the hook every node-launcher rank starts with (a real Python process, its
pipe, its dump), the dump read as plain data only, and the ranks folded on dumps four real gloo ranks wrote
(tests/unit/data/flight-recorded: one rank that never called the collective the others wait in, one that called
another collective; recorded with torchrun --nproc-per-node 4 and this hook, asked through its pipe)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertool.jobs import flightfold
from clustertool.jobs.stacks import RankStack
from clustertool.nodeprogs import flightrec, frhook, jobagent

pytestmark = pytest.mark.unit
DATA = Path(__file__).parent / "data" / "flight-recorded"
NODE = {0: "node-1", 1: "node-2", 2: "node-3", 3: "node-4"}


def ranks(run: str) -> list[RankStack]:
    out = []
    for rank in range(4):
        flight = flightrec.read_dump(str(DATA / run / f"dump.rank{rank}"))
        out.append(RankStack(rank, NODE[rank], 100 + rank, "py-spy", flight=flight))
    return out


def test_the_recorded_dumps_read_as_plain_data():
    stacks = ranks("skip")
    assert all(s.flight["status"] == "ok" and s.flight["backend"] == "gloo" for s in stacks)
    assert stacks[0].flight["torch"].startswith("2.13") and stacks[2].flight["rank"] == 2
    assert stacks[0].flight["pgs"]["0"] == {"enqueued": 7, "started": -1, "completed": 6}
    assert stacks[2].flight["pgs"]["0"]["enqueued"] == 6
    last = [(e["seq"], e["op"]) for e in stacks[0].flight["last"][-2:]]
    assert last == [(6, "gloo:broadcast"), (7, "gloo:all_reduce")]


def test_the_rank_that_never_called_the_collective_the_others_wait_in_is_named():
    lines = flightfold.fold(ranks("skip"))
    assert lines == [
        "Flight Recorder (gloo, torch 2.13.0+cpu): the default process group: ranks 0-1,3 (node-[1-2,4]) wait in "
        "collective #7 (gloo:all_reduce)",
        "Flight Recorder (gloo, torch 2.13.0+cpu): the default process group: rank 2 (node-3) never called #7: its "
        "last collective is #6 (gloo:broadcast); its stack says where it is"]


def test_a_rank_that_called_another_collective_is_named():
    lines = flightfold.fold(ranks("order"))
    assert lines[-1] == ("Flight Recorder (gloo, torch 2.13.0+cpu): the default process group: collective #7 "
                         "differs: ranks 0,2-3 (node-[1,3-4]) gloo:all_reduce; rank 1 (node-2) gloo:broadcast "
                         "(collectives called in a different order)")
    assert "every rank called collective #7" in lines[0] or "every rank is in collective #7" in lines[0]


def test_ranks_without_a_record_say_why_once_per_reason_and_gone_ranks_say_nothing():
    stacks = ranks("skip")[:2] + [
        RankStack(2, "node-3", 9, "proc", flight={"status": "none", "why": "no Flight Recorder hook in this rank"}),
        RankStack(3, "node-4", 8, "proc", flight={"status": "none", "why": "no Flight Recorder hook in this rank"}),
        RankStack(4, "node-4", 7, "gone"), RankStack(5, "node-4", 6, "proc")]   # 5: a stacks program from before
    lines = flightfold.fold(stacks)
    assert lines[-1] == "Flight Recorder: ranks 2-3 (node-[3-4]): no Flight Recorder hook in this rank"
    assert lines[0] == ("Flight Recorder (gloo, torch 2.13.0+cpu): the default process group: every rank is in "
                        "collective #7 (gloo:all_reduce), none completed it (a peer outside these ranks, or the "
                        "network)")
    assert flightfold.fold([RankStack(0, "node-1", 1, "proc")]) == []


def test_a_dump_that_is_not_plain_data_is_refused(tmp_path):
    bad = tmp_path / "dump.1"
    bad.write_bytes(b'{"backend": "gloo"}\n' + pickle.dumps(os.getcwd.__call__))
    assert flightrec.read_dump(str(bad))["why"].startswith("unreadable dump: not plain data")
    said = tmp_path / "dump.2"
    said.write_bytes(b'{"none": "torch.distributed is not initialised in this process"}\n')
    assert flightrec.read_dump(str(said)) == {"status": "none",
                                             "why": "torch.distributed is not initialised in this process"}


def held_open(pid):
    """The paths a process holds open (an fd closed while they are read is left out)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return out


def test_the_hook_in_a_real_rank_answers_its_pipe_and_chains_the_users_sitecustomize(tmp_path):
    fr, mine = tmp_path / "fr", tmp_path / "user"
    (fr / "py").mkdir(parents=True)
    mine.mkdir()
    (fr / "py" / "sitecustomize.py").write_text(Path(frhook.__file__).read_text())
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    code = ("import os, subprocess, sys, time\n"
            "print(os.environ.get('USER_SITE_RAN'), flush=True)\n"
            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.5)'])   # a child: no pipe of its own\n"
            "time.sleep(60)\n")
    env = dict(os.environ, RANK="3", CLUSTERTOOL_FR_DIR=str(fr), PYTHONPATH=f"{fr / 'py'}:{mine}")
    env.pop("CLUSTERTOOL_FR_PID", None)
    rank = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "1"   # the user's own sitecustomize ran too
        deadline = time.monotonic() + 30
        while not (fr / f"pipe.{rank.pid}").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert str(fr / f"pipe.{rank.pid}") in held_open(rank.pid)   # open before it had its name: never ENXIO
        asked, why = flightrec.request(str(fr), [rank.pid, 999999])
        assert why[999999].startswith("no Flight Recorder hook in this rank (node launchers' ranks have it, unless")
        got = flightrec.collect(str(fr), [rank.pid], {rank.pid: 3}, asked, why, 30)
        assert got[rank.pid] == {"status": "none", "why": "torch.distributed is not initialised in this process"}
        assert sorted(p.name for p in fr.glob("pipe.*")) == [f"pipe.{rank.pid}"]
        assert str(fr / f"pipe.{rank.pid}") in held_open(rank.pid)   # and between requests
    finally:
        rank.kill()
        rank.wait()


def test_the_agent_puts_the_hook_first_on_the_ranks_path_and_leaves_the_users_settings(tmp_path):
    (tmp_path / "py").mkdir()
    assert jobagent.flight_env({"A": "1"}, str(tmp_path)) == {"A": "1"}   # no hook installed: nothing changes
    (tmp_path / "py" / "sitecustomize.py").write_text("")
    env = jobagent.flight_env({"PYTHONPATH": "/mine", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, str(tmp_path))
    assert env["PYTHONPATH"] == f"{tmp_path / 'py'}:/mine" and env["CLUSTERTOOL_FR_DIR"] == str(tmp_path)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["CLUSTERTOOL_FR_SET"] == "TORCH_NCCL_TRACE_BUFFER_SIZE"   # the hook may rename it
    assert "CLUSTERTOOL_FR_SET" not in jobagent.flight_env({"TORCH_FR_BUFFER_SIZE": "50"}, str(tmp_path))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl_")
    assert jobagent.flight_env({"CLUSTERTOOL_FR": "0"}, str(tmp_path)) == {"CLUSTERTOOL_FR": "0"}
    assert json.loads(json.dumps(env)) == env


@pytest.mark.parametrize("reads_new_name", [True, False], ids=["torch-reads-TORCH_FR", "older-torch"])
def test_the_hook_gives_the_record_size_the_name_the_ranks_torch_reads(tmp_path, reads_new_name):
    """A torch that reads TORCH_FR_BUFFER_SIZE warns that the NCCL name is deprecated; an older one reads only the
    NCCL name.  The hook reads which from torch's own source (a stand-in torch package here: not imported)."""
    fr, fake = tmp_path / "fr", tmp_path / "site"
    (fr / "py").mkdir(parents=True)
    (fr / "py" / "sitecustomize.py").write_text(Path(frhook.__file__).read_text())
    (fake / "torch" / "distributed").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise SystemExit('imported')\n")
    source = 'os.environ.get("TORCH_FR_BUFFER_SIZE")' if reads_new_name else 'os.environ.get("OTHER")'
    (fake / "torch" / "distributed" / "distributed_c10d.py").write_text(source + "\n")
    env = dict(jobagent.flight_env({k: v for k, v in os.environ.items() if "BUFFER_SIZE" not in k}, str(fr)),
               RANK="0", PYTHONPATH=f"{fr / 'py'}:{fake}")
    env.pop("CLUSTERTOOL_FR_PID", None)
    code = "import os; print(os.environ.get('TORCH_FR_BUFFER_SIZE'), os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == (["2000", "None"] if reads_new_name else ["None", "2000"]), out.stderr
