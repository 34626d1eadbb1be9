"""The recovery controller as a detached process on this machine (clustertool/controller/), on a real
2-node local cluster: it outlives the command that started it, there are never two of it (two starts at
once give one process), `stop` leaves no process; and its loop sees, on the real leader, the wait state the
restart loop writes when a node of a `--restarts 1 --replace-failed` job dies (node-2's namespace killed),
without claiming it (phase A: the replacing itself is wired in phase B; `recover` still does it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import REPO, run_cli
from tests.local.conftest import module_cluster, provider_state

pytestmark = pytest.mark.local
START = ("import sys\n"
         "from clustertool.cluster.session import ClusterSession\n"
         "from clustertool.controller import process\n"
         "print(process.start(ClusterSession.load(sys.argv[1]), poll=float(sys.argv[2])).pid)\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 2, "ctl", "--slots", "1")


@pytest.fixture
def home(cluster, monkeypatch):
    """This process works in the cluster's clustertool home too (start/stop/running are called here)."""
    name, env = cluster
    monkeypatch.setenv("CLUSTERTOOL_HOME", env["CLUSTERTOOL_HOME"])
    yield name, env
    from clustertool.controller import process

    process.stop(name)


def _starter(name: str, env: dict, poll: float = 1.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", START, name, str(poll)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _controllers(name: str) -> list[int]:
    """Live processes running this cluster's controller (zombies are gone for this purpose)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            continue
        if alive and b"clustertool.controller.daemon" in words and name.encode() in words:
            found.append(int(pid))
    return found


def test_the_controller_outlives_its_starter_is_never_two_and_stop_leaves_no_process(home):
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process

    name, env = home
    starter = _starter(name, env)
    out, err = starter.communicate(timeout=120)
    assert starter.returncode == 0, err
    pid = int(out.split()[-1])
    assert _controllers(name) == [pid] and process.running(name) == pid   # the starter is gone, it is not
    assert os.getsid(pid) == pid  # a session of its own: no terminal's hangup reaches it
    again = process.start(ClusterSession.load(name))
    assert (again.pid, again.already) == (pid, True) and _controllers(name) == [pid]
    assert "controller of " + name + " started" in Path(again.log).read_text()

    stopped = process.stop(name)
    assert (stopped.pid, stopped.how) == (pid, "stopped") and _controllers(name) == []
    assert process.running(name) is None and process.stop(name).how == "not running"
    assert f"controller of {name} stopped" in Path(again.log).read_text()

    both = [_starter(name, env), _starter(name, env)]  # two at once: one wins the lock, both name it
    pids = {int(p.communicate(timeout=120)[0].split()[-1]) for p in both}
    assert len(pids) == 1 and _controllers(name) == list(pids)
    assert process.stop(name).how == "stopped" and _controllers(name) == []


def _status(name: str) -> dict:
    from clustertool.controller import process

    path = process.files(name).status
    return json.loads(path.read_text()) if path.exists() else {}


def test_the_controller_sees_a_job_wait_for_the_replacement_of_a_killed_node_and_claims_nothing(home):
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process

    name, env = home
    started = process.start(ClusterSession.load(name), poll=1.0)
    run = run_cli("run", "-c", name, "--restarts", "1", "--replace-failed", "--replace-wait", "2m", "--",
                  "sleep", "600", env=env)
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split()[-1]
    try:
        ns = net.netns_name(name, 2)
        sysops.kill_all(sysops.pids_in_netns([ns])[ns])  # node-2 dies: sshd, orted and its rank
        deadline = time.monotonic() + 120
        while not [h for h in _status(name).get("handled", []) if h["job"] == job_id]:
            assert time.monotonic() < deadline, (_status(name), Path(started.log).read_text()[-2000:])
            time.sleep(0.5)
        (handled,) = [h for h in _status(name)["handled"] if h["job"] == job_id]
        assert handled["nodes"] == ["node-2"] and handled["attempt"] == 1
        log = Path(started.log).read_text()
        assert f"job {job_id} waits on node-1 for node-2 to be replaced (attempt 1, until " in log
        job_dir = Path(provider_state(env, name)["nodes_dir"]) / "node-1" / "home" / ".clustertool" / "jobs" / job_id
        assert not list(job_dir.glob("replacing.*"))  # not claimed: `recover` would still replace the node
        (seen,) = [w for w in _status(name)["waiting"] if w["job"] == job_id]
        assert (seen["claimed"], seen["replaced"]) == (False, False)
        line = process.status_line(name) or ""
        assert line.startswith(f"running (pid {started.pid}), last look at node-1 ") and \
            line.endswith(f"{job_id} waits for node-2"), line
    finally:
        run_cli("kill", "-c", name, job_id, env=env)
    deadline = time.monotonic() + 60
    while any(w["job"] == job_id and not w["killed"] for w in _status(name).get("waiting", [])):
        assert time.monotonic() < deadline, _status(name)
        time.sleep(0.5)
    assert process.stop(name).how == "stopped"
    assert process.status_line(name) == "not running (`up --controller` starts it)"
