"""The API's results are what the commands print with --json (the CLI renders the same objects),
`run --sync [DIR]` parses as users type it, and a playbook's `run` step takes `sync:`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from clustertool.cli.app import run
from clustertool.cli.common import fill_bare_values
from clustertool.cluster import lifecycle, status
from clustertool.core.model import ClusterRecord, GroupResult, HostResult, JobRecord, Node
from clustertool.jobs.jobrequests import SyncPolicy
from clustertool.jobs.launch import Launch
from clustertool.transfer.results import CopyResult, NodeCopy
from tests.conftest import REPO, run_cli
from tests.fakes.cluster import saved_cluster

pytestmark = pytest.mark.cli

GROUP = GroupResult([HostResult("node-1", 0, "node-1\n", "", 0.25),
                     HostResult("node-2", 3, "", "disk full\n", 1.5),
                     HostResult("node-3", None, "", "", 10.0, error="timed out")])


@pytest.fixture
def x_cluster(ct_env):
    """Cluster x exists (the command makes its session from the state file); the core function the
    test patches does the rest."""
    return saved_cluster("x", 2)


def printed(capsys, *argv) -> tuple[int, object]:
    code = run(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_exec_json_is_the_group_results_to_dict(monkeypatch, capsys, x_cluster):
    monkeypatch.setattr("clustertool.remote.execute.execute", lambda *a, **k: GROUP)
    code, data = printed(capsys, "exec", "-c", "x", "--json", "--", "hostname")
    assert data == GROUP.to_dict() and code == GROUP.exit_code == 255
    assert data["results"][1] == {"node": "node-2", "exit_code": 3, "stdout": "", "stderr": "disk full\n",
                                  "duration": 1.5, "error": None}


def test_status_json_is_the_status_to_dict(monkeypatch, capsys, x_cluster):
    cluster = ClusterRecord("x", "local", nodes=[Node("node-1", 1, "10.0.0.1", role="leader")], status="ready")
    row = status.NodeStatus("node-1", "leader", "10.0.0.1", 1, "running", True)
    report = status.ClusterStatus(cluster, [row], {"price": "$0/h"})
    monkeypatch.setattr("clustertool.cluster.status.status", lambda *a, **k: report)
    code, data = printed(capsys, "status", "-c", "x", "--json")
    assert code == 0 and data == report.to_dict()
    assert data["nodes"][0]["reachable"] is True and data["price"] == "$0/h"


def test_copy_json_is_the_copy_results_to_dict(monkeypatch, capsys, x_cluster):
    result = CopyResult("/src", "/dest", "local", "chain", [NodeCopy("node-1", bytes_received=5, files_sent=1)],
                        total_bytes=5, total_files=1, bytes_sent=5, passes=1, verified=True)
    monkeypatch.setattr("clustertool.transfer.copy.copy", lambda *a, **k: result)
    code, data = printed(capsys, "copy", "-c", "x", "--json", "/src", "/dest")
    assert code == 0 and data == result.to_dict() and data["exit_code"] == 0


def test_run_json_is_the_launchs_to_dict_with_what_sync_sent(monkeypatch, capsys, x_cluster):
    job = JobRecord("j1", "x", ["python", "t.py"], nodes=["node-1"], np=1, workdir="/p")
    synced = CopyResult("/p", "/p", "local", "chain", [NodeCopy("node-1", files_sent=2)], bytes_sent=9)
    seen = {}

    def fake_run(session, request, **kwargs):
        seen.update(request=request)
        return Launch(job, ["mpirun"], sync=("/p", "/p"), synced=synced)

    monkeypatch.setattr("clustertool.jobs.launch.run", fake_run)
    code, data = printed(capsys, "run", "-c", "x", "--sync", "--json", "--", "python", "t.py")
    assert code == 0 and data == Launch(job, ["mpirun"], synced=synced).to_dict()
    assert data["sync"]["bytes_sent"] == 9 and data["id"] == "j1"
    assert seen["request"].sync == SyncPolicy(".", None) and seen["request"].command == ("python", "t.py")


def test_kill_json_is_the_kill_results_to_dict(monkeypatch, capsys, x_cluster):
    from clustertool.jobs.kill import KillResult, NodeKill

    result = KillResult(JobRecord("j1", "x", ["sleep", "9"], state="killed"),
                        [NodeKill("node-1", signaled=[10, 11]), NodeKill("node-2", remaining=["12:python"])])
    monkeypatch.setattr("clustertool.jobs.kill.kill", lambda *a, **k: result)
    code, data = printed(capsys, "kill", "-c", "x", "--json", "j1")
    assert code == 1 and data == result.to_dict() and data["clean"] is False
    assert data["nodes"][1]["remaining"] == ["12:python"] and data["job"]["state"] == "killed"


def test_up_json_is_the_up_results_to_dict(monkeypatch, capsys):
    result = lifecycle.UpResult(ClusterRecord("x", "local", status="ready"), hostfile=REPO / "hostfiles" / "x",
                                timings={"total": 1.0})
    monkeypatch.setattr("clustertool.cluster.lifecycle.up", lambda *a, **k: result)
    code, data = printed(capsys, "up", "--provider", "local", "--nodes", "1", "--name", "x", "--json")
    assert code == 0 and data == result.to_dict() and data["hostfile"] == str(REPO / "hostfiles" / "x")


@pytest.mark.parametrize("args, expected", [
    (["--sync", "--", "python", "t.py"], ["--sync=.", "--", "python", "t.py"]),
    (["--sync"], ["--sync=."]),
    (["--sync", "--np", "2", "--", "x"], ["--sync=.", "--np", "2", "--", "x"]),
    (["--sync", "src", "--", "x"], ["--sync", "src", "--", "x"]),
    (["--sync=src", "--", "x"], ["--sync=src", "--", "x"]),
    (["--name", "--sync", "--", "x"], ["--name", "--sync", "--", "x"]),        # --sync as --name's value
    (["--", "python", "t.py", "--sync"], ["--", "python", "t.py", "--sync"]),  # the program's own flag
    (["python", "t.py", "--sync"], ["python", "t.py", "--sync"]),
])
def test_a_bare_sync_reads_as_this_folder_and_nothing_after_the_command_changes(args, expected):
    assert fill_bare_values(args, {"--sync": "."}, {"--name", "--np", "--sync"}) == expected


@pytest.fixture
def recorded(ct_env, tmp_path):
    saved_cluster("rec", 2, provider="local")
    project = tmp_path / "proj"
    project.mkdir()
    return ct_env, project


def test_run_sync_dry_run_works_in_the_synced_folder(recorded):
    env, project = recorded
    proc = run_cli("run", "--sync", str(project), "--dry-run", "--", "python", "t.py", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"-wdir {project} " in proc.stdout
    assert f"would sync {project} to {project} on 2 node(s)" in proc.stderr
    here = subprocess.run([sys.executable, "-m", "clustertool", "run", "--sync", "--dry-run", "--json", "--",
                           "python", "t.py"], env=env, cwd=project, capture_output=True, text=True)
    data = json.loads(here.stdout)
    assert data["sync"] == {"dir": str(project), "dest": str(project)}
    assert data["argv"][data["argv"].index("-wdir") + 1] == str(project)
    to = run_cli("run", "--sync", str(project), "--sync-to", "/scratch/p", "--dry-run", "--", "x", env=env)
    assert "-wdir /scratch/p " in to.stdout


@pytest.mark.parametrize("args, needle", [
    (["--sync", "python", "t.py"], "--sync 'python': no such folder here"),
    (["--sync", "--workdir", "/elsewhere", "--", "x"], "leave out --workdir"),
    (["--sync-to", "/x", "--", "x"], "--sync-to goes with --sync"),
    (["--sync", "--sync-to", "relative", "--", "x"], "give an absolute path"),
    (["--sync", "/", "--", "x"], "refusing to send the whole file system"),
])
def test_bad_sync_input_is_one_line_before_any_ssh(recorded, args, needle):
    env, _ = recorded
    proc = run_cli("run", *args, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and needle in proc.stderr.splitlines()[0], proc.stderr


def test_a_playbook_run_step_takes_sync_true_or_a_folder(recorded, tmp_path):
    from clustertool.cli.play import resolver
    from clustertool.playbook import load

    env, project = recorded
    path = tmp_path / "pb.yaml"
    path.write_text("cluster: rec\nsteps:\n"
                    "  - run: {sync: true, dry_run: true, command: 'python t.py'}\n"
                    f"  - run: {{sync: {project}, sync_to: /scratch/p, dry_run: true, command: 'python t.py'}}\n"
                    "  - run: {sync: false, dry_run: true, command: 'python t.py'}\n")
    steps = load.load(path, {}, resolver).steps
    assert steps[0].argv[:2] == ["run", "--sync"] and "--sync" not in steps[2].argv
    assert steps[1].argv[:5] == ["run", "--sync", str(project), "--sync-to", "/scratch/p"]
    for step, wdir in zip(steps, [REPO, "/scratch/p", None]):
        proc = run_cli(*step.argv, env=env)  # the real CLI takes each step's argv
        assert proc.returncode == 0, proc.stderr
        assert (f"-wdir {wdir} " in proc.stdout) if wdir else ("-wdir" not in proc.stdout)


def test_a_playbook_run_step_takes_a_launcher_and_a_hang_timeout(recorded, tmp_path):
    from clustertool.cli.play import resolver
    from clustertool.playbook import load

    env, _ = recorded
    path = tmp_path / "pb.yaml"
    path.write_text("cluster: rec\nsteps:\n"
                    "  - run: {launcher: torchrun, hang_timeout: 10m, dry_run: true, command: 'python t.py --lr 1'}\n")
    [step] = load.load(path, {}, resolver).steps
    assert step.argv[:5] == ["run", "--launcher", "torchrun", "--hang-timeout", "10m"]
    proc = run_cli(*step.argv, env=env)  # the real CLI: one torchrun a node, python's script kept
    assert proc.returncode == 0, proc.stderr
    assert "/fan.py' -H 10.0.0.1,10.0.0.2 " in proc.stdout and "-m torch.distributed.run --nnodes" in proc.stdout
    assert "t.py --lr 1" not in proc.stdout.splitlines()[0]  # the fan-out starts the agents; each node's line has it
    assert "--master-port PORT t.py --lr 1" in proc.stdout and "{agent}" not in proc.stdout


def test_import_clustertool_is_cheap_and_help_loads_no_fabric():
    code = ("import sys, clustertool\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('clustertool'))\n"
            "from clustertool.cli.app import run\n"
            "run(['--help']); run(['run', '--help'])\n"
            "heavy = [m for m in ('fabric', 'paramiko', 'invoke', 'boto3', 'clustertool.api') if m in sys.modules]\n"
            "from clustertool import Cluster\n"
            "sys.stderr.write(repr((loaded, heavy, Cluster.__module__, 'fabric' in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, COLUMNS="100"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == repr((["clustertool"], [], "clustertool.api", False))


def test_the_api_page_compiles_and_names_only_real_methods():
    """Every `.name(` the Python API page (docs/python-api.md) shows exists on Cluster, Job or the results."""
    from clustertool.api import Cluster, Job

    section = (REPO / "docs" / "python-api.md").read_text()
    script = section.split("```python\n", 1)[1].split("```", 1)[0]
    compile(script, "docs/python-api.md", "exec")
    named = set(re.findall(r"[`,] ?`?(?:Cluster|Job)?\.(\w+)\(", section))
    owners = (Cluster, Job, GroupResult, status.ClusterStatus)
    assert named >= {"up", "load", "status", "exec", "copy", "run", "wait", "logs", "kill", "fabric", "down"}
    assert sorted(m for m in named if not any(hasattr(o, m) for o in owners)) == []
