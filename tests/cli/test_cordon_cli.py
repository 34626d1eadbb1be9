"""`cordon` / `uncordon` as a user types them, on a recorded cluster (no machine is reached: the
cluster is stopped, so only the record and this machine's hostfile change; the leader's ~/hostfile
and real jobs are the local tier's, tests/local/test_cordon.py)."""

from __future__ import annotations

import json

import pytest

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node
from tests.conftest import run_cli

pytestmark = pytest.mark.cli


@pytest.fixture
def stopped(ct_env, tmp_path):
    nodes = [Node(f"node-{i}", i, f"10.213.250.{i}", role="leader" if i == 1 else "member", slots=2)
             for i in range(1, 5)]
    hostfile = tmp_path / "hf" / "cz"
    state.save(ClusterRecord("cz", "local", nodes=nodes, status="stopped", hostfile_path=str(hostfile)))
    return hostfile


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: ") and len(first) < 160, proc.stderr
    for needle in needles:
        assert needle in first, first


def test_cordon_then_uncordon_shows_in_ls_and_the_hostfile(ct_env, stopped):
    proc = run_cli("cordon", "node-3", "--reason", "Xid 79 on GPU 2", "--json", env=ct_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["changed"] == ["node-3"] and out["cordons"]["node-3"]["reason"] == "Xid 79 on GPU 2"
    assert "stopped" in out["leader_hostfile"]
    assert "10.213.250.3 " not in stopped.read_text() and stopped.read_text().count("slots=2") == 3
    listed = json.loads(run_cli("ls", "--json", env=ct_env).stdout)
    assert listed[0]["cordoned"] == ["node-3"]
    shown = run_cli("hostfile", "--format", "deepspeed", env=ct_env)
    assert "10.213.250.3" not in shown.stdout and "left out cordoned node-3" in shown.stderr
    text = run_cli("cordon", "node-[3-4]", env=ct_env)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith("cordoned node-4: out of the hostfiles")
    assert "node-3: cordoned" in text.stdout and "Xid 79 on GPU 2, unchanged" in text.stdout
    back = run_cli("uncordon", "node-3", "node-4", env=ct_env)
    assert back.returncode == 0 and back.stdout.startswith("uncordoned node-[3-4]: back in the hostfiles"), back
    assert stopped.read_text().count("slots=2") == 4
    assert json.loads(run_cli("ls", "--json", env=ct_env).stdout)[0]["cordoned"] == []


def test_the_leader_and_unknown_nodes_are_one_line_and_change_nothing(ct_env, stopped):
    _one_line_error(run_cli("cordon", "node-1", env=ct_env), "node-1 is the leader and cannot be cordoned")
    _one_line_error(run_cli("cordon", "all", env=ct_env), "leader")
    _one_line_error(run_cli("cordon", "node-9", env=ct_env), "has no node node-9")
    _one_line_error(run_cli("uncordon", "node-x;rm", env=ct_env), "';'")
    assert state.load("cz").cordoned == [] and not stopped.exists()


def test_run_refuses_a_cordoned_node_by_name_and_leaves_it_out_by_default(ct_env, stopped):
    record = state.load("cz")
    record.status = "ready"  # type: ignore[assignment]
    record.node("node-2").cordon = {"reason": "ECC errors", "since": 1.0, "by": "user"}
    state.save(record)
    _one_line_error(run_cli("run", "--nodes", "node-2", "--dry-run", "--", "hostname", env=ct_env),
                    "node-2 is cordoned (ECC errors): jobs do not run there")
    for launcher in ("mpirun", "torchrun"):
        proc = run_cli("run", "--dry-run", "--json", "--launcher", launcher, "--", "python3", "t.py", env=ct_env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["nodes"] == ["node-1", "node-3", "node-4"]
