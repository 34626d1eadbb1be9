"""The recovery controller as a detached process on this machine (clustertool/controller/), on a real
2-node local cluster: it outlives the command that started it, there are never two of it (two starts at
once give one process), `stop` leaves no process; and its loop sees, on the real leader, the wait state the
restart loop writes when a node of a `--restarts 1 --replace-failed` job dies (node-2's namespace killed),
and leaves alone a wait another replacer (`recover`) claimed.  The replacing itself: test_controller_recovery.py.
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
from tests.local.conftest import controllers, module_cluster, provider_state

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


def test_the_controller_outlives_its_starter_is_never_two_and_stop_leaves_no_process(home):
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process

    name, env = home
    starter = _starter(name, env)
    out, err = starter.communicate(timeout=120)
    assert starter.returncode == 0, err
    pid = int(out.split()[-1])
    assert controllers(name) == [pid] and process.running(name) == pid   # the starter is gone, it is not
    assert os.getsid(pid) == pid  # a session of its own: no terminal's hangup reaches it
    again = process.start(ClusterSession.load(name))
    assert (again.pid, again.already) == (pid, True) and controllers(name) == [pid]
    assert "controller of " + name + " started" in Path(again.log).read_text()

    stopped = process.stop(name)
    assert (stopped.pid, stopped.how) == (pid, "stopped") and controllers(name) == []
    assert process.running(name) is None and process.stop(name).how == "not running"
    assert f"controller of {name} stopped" in Path(again.log).read_text()

    both = [_starter(name, env), _starter(name, env)]  # two at once: one wins the lock, both name it
    pids = {int(p.communicate(timeout=120)[0].split()[-1]) for p in both}
    assert len(pids) == 1 and controllers(name) == list(pids)
    assert process.stop(name).how == "stopped" and controllers(name) == []


def _status(name: str) -> dict:
    from clustertool.controller import process

    path = process.files(name).status
    return json.loads(path.read_text()) if path.exists() else {}


def _waiting(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / "attempts.json").read_text()).get("waiting")
    except (OSError, ValueError):  # not written yet (it is written whole, then moved)
        return None


def test_the_controller_leaves_a_wait_another_replacer_claimed_alone(home):
    """`recover` and the controller claim a wait with ``mkdir replacing.<attempt>`` on the leader: a wait claimed
    by another replacer (made here, as `recover` does, before the controller starts) is seen and left alone."""
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process

    name, env = home
    run = run_cli("run", "-c", name, "--restarts", "1", "--replace-failed", "--replace-wait", "2m", "--",
                  "sleep", "600", env=env)
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split()[-1]
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    job_dir = nodes_dir / "node-1" / "home" / ".clustertool" / "jobs" / job_id
    try:
        ns = net.netns_name(name, 2)
        sysops.kill_all(sysops.pids_in_netns([ns])[ns])  # node-2 dies: sshd, orted and its rank
        deadline = time.monotonic() + 120
        while not _waiting(job_dir):
            assert time.monotonic() < deadline, "the restart loop did not wait for a replacement"
            time.sleep(0.5)
        (job_dir / "replacing.1").mkdir()  # another replacer has it
        started = process.start(ClusterSession.load(name), poll=1.0)
        deadline = time.monotonic() + 120
        while not [w for w in _status(name).get("waiting", []) if w["job"] == job_id]:
            assert time.monotonic() < deadline, (_status(name), Path(started.log).read_text()[-2000:])
            time.sleep(0.5)
        (seen,) = [w for w in _status(name)["waiting"] if w["job"] == job_id]
        assert (seen["nodes"], seen["attempt"], seen["claimed"], seen["replaced"]) == (["node-2"], 1, True, False)
        assert _status(name)["handled"] == []  # left alone: no replacement, no second claim
        assert not (job_dir / "replaced").exists()
        line = process.status_line(name) or ""
        assert line.startswith(f"running (pid {started.pid}), last look at node-1 ") and \
            line.endswith("no job waits"), line
    finally:
        run_cli("kill", "-c", name, job_id, env=env)
    deadline = time.monotonic() + 60
    while any(w["job"] == job_id and not w["killed"] for w in _status(name).get("waiting", [])):
        assert time.monotonic() < deadline, _status(name)
        time.sleep(0.5)
    assert process.stop(name).how == "stopped"
    assert process.status_line(name) == "not running (`up --controller` starts it)"


def test_a_sweep_stops_a_controller_whose_cluster_state_is_gone(home):
    """`down --sweep` stops this home's controllers whose cluster state was removed (each would also end at its
    next round; this one's rounds are 10 minutes apart, so only the sweep's stop ends it now)."""
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process
    from clustertool.core import state

    name, env = home
    other = name + "-gone"
    doc = json.loads(state.state_path(name).read_text())
    doc["name"] = other
    state.state_path(other).write_text(json.dumps(doc))
    try:
        started = process.start(ClusterSession.load(other), poll=600)
        assert controllers(other) == [started.pid] and process.strays() == []  # its state is there: not a stray
        state.state_path(other).unlink()  # the state is gone, the process not yet
        assert process.strays() == [(started.pid, other)]
        assert process.stop_strays() == [f"{other}: stopped its controller (pid {started.pid}), whose cluster "
                                         "state is gone"]
        assert controllers(other) == [] and process.strays() == []
    finally:
        for pid in controllers(other):
            os.kill(pid, 9)
        state.delete(other)


def test_recover_says_the_controller_replaces_lost_nodes_too(home):
    from clustertool.cluster.session import ClusterSession
    from clustertool.controller import process

    name, env = home
    started = process.start(ClusterSession.load(name), poll=1.0)
    done = run_cli("recover", "-c", name, env=env)
    assert done.returncode == 0, done.stderr
    assert (f"the cluster's controller (pid {started.pid}) replaces lost nodes too: each wait is claimed once on "
            "the leader, so nothing is replaced twice") in done.stderr
    assert "no running job run with --replace-failed" in done.stdout
    assert process.stop(name).how == "stopped"
