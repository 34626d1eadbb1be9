"""`up --scheduler slurm` on a real 4-node local cluster, 2 slots (and 2 stand-in GPUs) a node, every command
through the CLI as a user runs it.  Real slurmctld, slurmd and munged (Debian's 22.05) inside the nodes; the
stand-in GPUs are character devices in each node's own /dev with no driver behind them (GRES counts them).

What a user would notice: every node idle in sinfo once `up` returns; a 2-node job under each launcher (mpirun
inside the allocation, torchrun, accelerate, deepspeed and process started by srun) with the same variables and
results; a second job waits in the queue (`jobs` shows it pending, with Slurm's reason and who submitted it) and
both succeed; a teammate's home that adopted the cluster (`--slurm-login`) queues behind the maker's job and
both succeed, and its `down` leaves the made Slurm as it was; a failing rank's exit code is the job's; a cordon
is a drain in sinfo and the drained node gets no work; `kill` leaves nothing in Slurm or on the nodes;
`run --after` chains; `--restarts` requeues; a node's death requeues the job (Slurm's SlurmdTimeout shortened
for the test, through CLUSTERTOOL_SLURM_TIMERS) and the job ends once the node is back; stop/start and replace
bring the daemons back; `down` leaves no slurmd, slurmctld or munged (tests/local/conftest.py's leftover check).

Run this file alone: it is heavy for a shared 2-core machine (`pytest tests/local/test_slurm_cluster.py`)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from clustertool.workloads import node_python
from tests.conftest import run_cli, unique
from tests.local.conftest import local_leftovers, module_cluster, slurm_daemons, stop_node_sshd, torch_teardown_abort
from tests.local.test_launchers import gone_within, launch_words, needs
from tests.local.test_slurm import _slurm_missing

pytestmark = pytest.mark.local
NODES, SLOTS = 4, 2
CONF = "/root/.clustertool/slurm/etc/slurm.conf"
TIMERS = "slurmd_timeout=20,message_timeout=5"  # a dead node is DOWN within ~20-27 s, not 5 min


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _slurm_missing()
    if reason:
        pytest.skip(reason)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLUSTERTOOL_SLURM_TIMERS", TIMERS)
        yield from module_cluster(tmp_path_factory, NODES, "sc", "--slots", str(SLOTS), "--scheduler", "slurm")


@pytest.fixture(scope="module")
def folder():
    path = Path("/var/tmp") / f"ct-test-slurm-{uuid.uuid4().hex[:8]}"  # every local node sees /var/tmp
    path.mkdir()
    from tests.local.test_ddp_env import TRAIN

    (path / "train.py").write_text(TRAIN)
    yield path
    shutil.rmtree(path)


def ct(env, *args, timeout=300):
    return run_cli(*args, env=env, timeout=timeout)


def on(env, name, node, command) -> str:
    proc = ct(env, "exec", "-c", name, "-n", node, "--json", "--", command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["results"][0]["stdout"]


def sinfo(env, name) -> dict[str, tuple[str, str, str]]:
    """node -> (state, GRES, reason), as Slurm says it on the leader."""
    out = on(env, name, "node-1", f"env SLURM_CONF={CONF} sinfo --noheader --Node --format '%N|%T|%G|%E'")
    return {n: (s, g, r) for n, s, g, r in (line.split("|", 3) for line in out.splitlines())}


def jobs(env, name) -> dict:
    proc = ct(env, "jobs", "-c", name, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def job(env, name, job_id) -> dict:
    return next(j for j in jobs(env, name)["jobs"] if j["id"] == job_id)


def submit(env, name, *words) -> str:
    proc = ct(env, "run", "-c", name, *words)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def wait_for(what, predicate, timeout=180, explain=None):
    """The predicate's first true value; past the timeout, fails saying what, and what explain() returns."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s" + (f"\n{explain()}" if explain else "")
        time.sleep(1)


def slurm_view(env, name, job_id) -> str:
    """What Slurm and clustertool say of a job and the nodes, and slurmctld's last lines: for a failure's message."""
    log = "/root/.clustertool/slurm/log/slurmctld.log"
    words = [f"env SLURM_CONF={CONF} scontrol show job --oneliner 2>&1 | tail -5",
             f"env SLURM_CONF={CONF} sinfo --Node --long 2>&1", f"tail -40 {log} 2>&1"]
    parts = [json.dumps(job(env, name, job_id), indent=1)[-3000:]]
    parts += [ct(env, "exec", "-c", name, "-n", "node-1", "--", w).stdout[-4000:] for w in words]
    return "\n".join(parts)


def wait_idle(env, name, nodes, timeout=120):
    return wait_for(f"{nodes} idle", lambda: all(sinfo(env, name).get(n, ("",))[0] == "idle" for n in nodes), timeout)


def test_up_returns_once_every_node_is_idle_in_slurm_with_its_stand_in_gpus(cluster):
    name, env = cluster
    seen = sinfo(env, name)
    assert sorted(seen) == [f"node-{i}" for i in range(1, NODES + 1)]
    assert {v[:2] for v in seen.values()} == {("idle", f"gpu:{SLOTS}")}
    record = json.loads((Path(env["CLUSTERTOOL_HOME"]) / "clusters" / f"{name}.json").read_text())
    scheduler = record["scheduler"]
    assert (scheduler["kind"], scheduler["made"], scheduler["nodes"]) == ("slurm", True, sorted(seen))
    assert scheduler["release"] == on(env, name, "node-2", "slurmd -V").split()[-1]


# mpirun and torchrun (one node agent per node) in the default run; the other node launchers go through Slurm the
# way torchrun does (srun starts the same agent, whose launcher code tests/local/test_launchers.py runs for each):
# `make test-slow` runs them, 2 minutes of a loaded 2-core box.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", pytest.param("process", marks=SLOW),
                                      pytest.param("accelerate", marks=SLOW), pytest.param("deepspeed", marks=SLOW)])
def test_a_two_node_job_under_each_launcher_goes_through_sbatch_with_the_same_variables(cluster, folder, launcher):
    pytest.importorskip("torch", reason="PyTorch (CPU) is installed by `make venv`")
    needs(launcher)
    name, env = cluster
    words = launch_words(launcher, str(folder / "train.py"))
    args = words if words[0] == "--launcher" else ["--", *words]
    proc = ct(env, "run", "-c", name, "--np", "4", "--no-tag-output", "--follow", *args, timeout=600)
    torn = torch_teardown_abort(proc)
    assert proc.returncode == 0 or torn, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = re.findall(r"rank (\d) of (\d) local (\d) node (\d) on (\S+) params (\S+)", proc.stdout)
    by_rank = {int(r[0]): r for r in lines}
    assert sorted(by_rank) == [0, 1, 2, 3] and {r[1] for r in lines} == {"4"}, proc.stdout[-3000:]
    hosts = [by_rank[i][4] for i in range(4)]
    # two nodes Slurm chose, two ranks each, rank r local r % 2 on the allocation's node r // 2
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    assert [(by_rank[i][2], by_rank[i][3]) for i in range(4)] == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]
    assert len({r[5] for r in lines}) == 1  # DDP kept the ranks in step
    job_id = re.search(r"job (j[0-9a-f-]+) queued in Slurm as job (\d+)", proc.stderr).group(1)
    record = job(env, name, job_id)
    assert record["launcher"] == launcher and record["slurm"]["id"].isdigit()
    assert record["slurm"]["state"] == ("FAILED" if torn else "COMPLETED") and sorted(record["nodes"]) == sorted(
        set(hosts))
    logged = ct(env, "logs", "-c", name, job_id)
    assert sorted(set(re.findall(r"rank (\d) of 4", logged.stdout))) == ["0", "1", "2", "3"]
    assert gone_within(name, job_id, 15) == []


def test_a_second_job_waits_in_the_queue_and_both_succeed(cluster, folder):
    name, env = cluster
    release = folder / f"release-{uuid.uuid4().hex[:6]}"
    hold = submit(env, name, "--launcher", "process", "--name", "first", "--", "sh", "-c",
                  f"while [ ! -e {release} ]; do sleep 0.2; done; echo first $RANK")
    wait_for("the first job runs", lambda: job(env, name, hold)["state"] == "running")
    second = submit(env, name, "--np", "2", "--launcher", "process", "--name", "second", "--",
                    "sh", "-c", "echo second $RANK")
    waiting = wait_for("the second job waits for Resources", lambda: (
        lambda j: j if j["state"] == "pending" and j["slurm"].get("reason") in ("Resources", "Priority") else None)(
        job(env, name, second)))
    assert waiting["slurm"]["user"] in ("", "root")  # its waiter has seen it queued
    queue = {q["job"]: q for q in jobs(env, name)["queue"]}
    assert (queue[hold]["state"], queue[second]["state"], queue[second]["user"]) == ("RUNNING", "PENDING", "root")
    shown = ct(env, "jobs", "-c", name).stdout
    assert re.search(rf"{second}\s+second\s+pending \((Resources|Priority)\)", shown), shown
    release.touch()
    for job_id in (hold, second):
        done = wait_for(f"{job_id} ends", lambda j=job_id: (lambda r: r if r["state"] != "running" and r["state"] !=
                                                            "pending" else None)(job(env, name, j)))
        assert (done["state"], done["exit_code"], done["slurm"]["state"]) == ("succeeded", 0, "COMPLETED"), done
    assert job(env, name, second)["slurm"]["attempts"][0]["start"] >= job(env, name, hold)["slurm"]["attempts"][0][
        "start"]


def slurm_as_made(env, name) -> tuple[str, list[tuple[int, str]], dict[str, str]]:
    """The made cluster's Slurm as its maker sees it: slurm.conf's digest, its daemons (pid, name), node states."""
    conf = on(env, name, "node-1", f"cat {CONF}")
    daemons = sorted((pid, comm) for pid, comm in slurm_daemons(name) if comm != "slurmstepd")  # (a job's own)
    return (hashlib.sha256(conf.encode()).hexdigest(), daemons,
            {n: v[0] for n, v in sinfo(env, name).items()})


def wired(env, name, adopter) -> list[str]:
    """What the adopting home's `up` put on each node (its key, its ~/.ssh/config block), as the maker finds it."""
    proc = ct(env, "exec", "-c", name, "-n", "all", "--json", "--", f"ls /root/.ssh | grep -F clustertool-{adopter}; "
              f"grep -F 'clustertool {adopter}' /root/.ssh/config; true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [r["stdout"] for r in sorted(json.loads(proc.stdout)["results"], key=lambda r: r["node"])]


def test_a_teammate_who_adopted_the_cluster_queues_behind_the_makers_job_and_both_succeed(cluster, folder, tmp_path):
    """docs/slurm.md's "Share it": home A made the cluster (`up --scheduler slurm`, the module's fixture); home B
    adopts it from its own machine (`up --provider static --slurm-login <the leader's address>`).  Both homes
    run as root here (one Unix user): the two "users" are two clustertool homes, as two teammates' machines
    would be, sharing the one Slurm queue.  B's key is the one A's nodes accept (A's cluster key), as a
    teammate's key the leader accepts."""
    name, env = cluster
    theirs = dict(env, CLUSTERTOOL_HOME=str(tmp_path / "home"), CLUSTERTOOL_HOSTFILE_DIR=str(tmp_path / "hf"))
    record = json.loads((Path(env["CLUSTERTOOL_HOME"]) / "clusters" / f"{name}.json").read_text())
    key = Path(env["CLUSTERTOOL_HOME"]) / "clusters" / name / "id_ecdsa"
    mine = unique("sb")
    before = slurm_as_made(env, name)
    release = folder / f"release-{uuid.uuid4().hex[:6]}"
    try:
        up = ct(theirs, "up", "--provider", "static", "--slurm-login", record["nodes"][0]["address"], "--key",
                str(key), "--user", "root", "--slurm-conf", CONF, "--name", mine)
        assert up.returncode == 0, up.stdout + up.stderr
        assert all(wired(env, name, mine)), up.stdout
        hold = submit(env, name, "--launcher", "process", "--name", "makers", "--", "sh", "-c",
                      f"while [ ! -e {release} ]; do sleep 0.2; done; echo makers $RANK")
        held = wait_for("the maker's job runs", lambda: (lambda j: j if j["state"] == "running" else None)(
            job(env, name, hold)))
        assert sorted(held["nodes"]) == sorted(before[2])  # it holds every node
        theirs_id = submit(theirs, mine, "--launcher", "process", "--name", "teammates", "--", "sh", "-c",
                           "echo teammates $RANK")
        waiting = wait_for("the teammate's job waits for Resources", lambda: (
            lambda j: j if j["state"] == "pending" and j["slurm"].get("reason") in ("Resources", "Priority") else None)(
            job(theirs, mine, theirs_id)))
        queue = {q["slurm_id"]: q for q in jobs(theirs, mine)["queue"]}
        makers = queue[held["slurm"]["id"]]  # not one of B's jobs: Slurm's name for it is A's job id
        assert (makers["state"], makers["job"], makers["name"], makers["user"]) == ("RUNNING", None, hold, "root")
        assert (queue[waiting["slurm"]["id"]]["state"], queue[waiting["slurm"]["id"]]["job"]) == ("PENDING", theirs_id)
        shown = ct(theirs, "jobs", "-c", mine).stdout
        assert re.search(rf"{theirs_id}\s+teammates\s+pending \((Resources|Priority)\)", shown), shown
        released = time.time()
        release.touch()
        for home, cname, job_id in ((env, name, hold), (theirs, mine, theirs_id)):
            done = wait_for(f"{job_id} ends", lambda h=home, c=cname, j=job_id: (
                lambda r: r if r["state"] not in ("running", "pending") else None)(job(h, c, j)))
            assert (done["state"], done["exit_code"], done["slurm"]["state"]) == ("succeeded", 0, "COMPLETED"), done
        started = job(theirs, mine, theirs_id)["slurm"]["attempts"][0]["start"]
        assert started >= released and started >= job(env, name, hold)["slurm"]["attempts"][0]["start"]
        ran = ct(theirs, "logs", "-c", mine, theirs_id).stdout
        assert sorted(set(re.findall(r"teammates (\d)", ran))) == [str(r) for r in range(NODES * SLOTS)], ran
    finally:
        release.touch()  # (a failure above must not leave the maker's job holding the nodes)
        gone = ct(theirs, "down", "-c", mine, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert local_leftovers(mine) == []
    assert wired(env, name, mine) == [""] * NODES  # B's key and ssh config block are gone from every node
    after = slurm_as_made(env, name)
    assert after[:2] == before[:2] and set(after[2].values()) == {"idle"}, (before, after)


def test_a_failing_ranks_exit_code_is_the_jobs_and_the_other_ranks_stop_at_once(cluster):
    name, env = cluster
    proc = ct(env, "run", "-c", name, "--np", "4", "--launcher", "process", "--follow", "--",
              "sh", "-c", 'if [ "$RANK" = 3 ]; then echo broken >&2; exit 7; fi; sleep 300')
    assert proc.returncode == 7, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "failed: rank 3 on node-" in proc.stderr and "exited 7: broken" in proc.stderr
    job_id = re.search(r"job (j[0-9a-f-]+) queued", proc.stderr).group(1)
    assert (job(env, name, job_id)["slurm"]["state"], job(env, name, job_id)["exit_code"]) == ("FAILED", 7)
    assert gone_within(name, job_id, 15) == []


def test_a_cordon_is_a_drain_and_the_drained_node_gets_no_work_until_uncordon(cluster):
    name, env = cluster
    done = ct(env, "cordon", "-c", name, "node-4", "--reason", "stand-in GPU 1 fell off the bus")
    assert done.returncode == 0 and "slurm: node-4 drained in Slurm" in done.stdout, done.stdout + done.stderr
    assert sinfo(env, name)["node-4"] == ("drained", f"gpu:{SLOTS}", "clustertool: stand-in GPU 1 fell off the bus")
    proc = ct(env, "run", "-c", name, "--launcher", "process", "--no-tag-output", "--follow", "--", "hostname")
    assert proc.returncode == 0 and sorted(set(proc.stdout.split()) & {f"node-{i}" for i in range(1, 5)}) == [
        "node-1", "node-2", "node-3"], proc.stdout
    assert "resumed in Slurm" in ct(env, "uncordon", "-c", name, "node-4").stdout
    wait_idle(env, name, ["node-4"])


WAITING = "import time\ndef waiting_here():\n    time.sleep(300)\nwaiting_here()\n"


def test_stacks_see_every_rank_and_kill_is_scancel_then_nothing_of_the_job_is_left(cluster, folder):
    name, env = cluster
    (folder / "wait.py").write_text(WAITING)
    job_id = submit(env, name, "--np", "4", "--launcher", "process", "--", *node_python(), str(folder / "wait.py"))
    wait_for("it runs", lambda: job(env, name, job_id)["state"] == "running")
    stacks = wait_for("every rank in its function", lambda: (lambda p: p if re.search(
        r"ranks 0-3 \(node-\[\d-\d\]\): waiting_here", p.stdout) else None)(ct(env, "stacks", "-c", name, job_id)))
    assert stacks.returncode == 0
    slurm_id = job(env, name, job_id)["slurm"]["id"]
    proc = ct(env, "kill", "-c", name, job_id, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["clean"] and result["slurm"] == "cancelled" and result["job"]["state"] == "killed"
    assert slurm_id not in {q["slurm_id"] for q in jobs(env, name).get("queue", [])}
    assert gone_within(name, job_id, 15) == []


def test_run_after_chains_one_job_to_the_end_of_another_however_it_ended(cluster, folder):
    name, env = cluster
    release = folder / f"release-{uuid.uuid4().hex[:6]}"
    first = submit(env, name, "--np", "2", "--launcher", "process", "--name", "before", "--", "sh", "-c",
                   f"while [ ! -e {release} ]; do sleep 0.2; done; exit 1")
    then = submit(env, name, "--np", "2", "--launcher", "process", "--after", "before", "--", "true")
    waiting = wait_for("the chained job waits", lambda: (lambda j: j if j["slurm"].get("reason") == "Dependency"
                                                         else None)(job(env, name, then)))
    assert waiting["state"] == "pending" and job(env, name, first)["state"] in ("pending", "running")
    release.touch()
    wait_for("both end", lambda: job(env, name, then)["state"] == "succeeded")
    assert job(env, name, first)["state"] == "failed"
    assert job(env, name, then)["slurm"]["attempts"][0]["start"] >= job(env, name, first)["slurm"]["attempts"][0][
        "end"] - 1


def test_restarts_requeue_a_failed_job_with_the_restart_count(cluster):
    name, env = cluster
    proc = ct(env, "run", "-c", name, "--np", "2", "--launcher", "process", "--restarts", "2", "--follow", "--",
              "sh", "-c", 'echo "try $CLUSTERTOOL_RESTART_COUNT"; [ "$CLUSTERTOOL_RESTART_COUNT" -ge 1 ] || exit 3')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "try 0" in proc.stdout and "try 1" in proc.stdout
    job_id = re.search(r"job (j[0-9a-f-]+) queued", proc.stderr).group(1)
    record = job(env, name, job_id)
    assert [(a["code"], a["cause"]) for a in record["attempts"]] == [(3, "exit code 3"), (0, None)]
    assert record["slurm"]["restarts"] == 1


def test_a_nodes_death_requeues_its_job_which_ends_once_the_node_is_back(cluster):
    name, env = cluster
    # the batch host (node-3, the allocation's first node) dies: only Slurm can end that run, by requeueing it
    job_id = submit(env, name, "--nodes", "node-[3-4]", "--launcher", "process", "--", "sh", "-c",
                    'if [ "$CLUSTERTOOL_RESTART_COUNT" = 0 ]; then sleep 600; fi; echo "back $RANK"')
    wait_for("it runs", lambda: job(env, name, job_id)["state"] == "running")
    stop_node_sshd(name, 3)  # the node's PID 1 ends with its sshd: every process of node-3 is gone
    requeued = wait_for("Slurm requeues it", lambda: (lambda j: j if j["slurm"].get("restarts") else None)(
        job(env, name, job_id)), timeout=180)
    assert requeued["attempts"][0]["cause"] == "node failure"
    assert ct(env, "reboot", "-c", name, "--nodes", "node-3", "--yes", timeout=300).returncode == 0
    done = wait_for("it ends", lambda: (lambda j: j if j["state"] not in ("running", "pending") else None)(
        job(env, name, job_id)), timeout=240, explain=lambda: slurm_view(env, name, job_id))
    assert (done["state"], done["slurm"]["state"], len(done["attempts"])) == ("succeeded", "COMPLETED", 2), done
    assert "back 0" in ct(env, "logs", "-c", name, job_id).stdout
    wait_idle(env, name, ["node-3", "node-4"])


def test_stop_and_start_bring_every_daemon_back_from_the_nodes_boot(cluster):
    name, env = cluster
    log = "/root/.clustertool/slurm/log/start.log"
    before = on(env, name, "node-2", f"cat {log} 2>/dev/null | wc -l").strip()
    assert ct(env, "stop", "-c", name).returncode == 0
    started = ct(env, "start", "-c", name)
    assert started.returncode == 0, started.stderr
    assert int(on(env, name, "node-2", f"wc -l < {log}").strip()) > int(before or 0)  # the boot hook ran it
    assert {v[0] for v in sinfo(env, name).values()} == {"idle"}
    doctor = ct(env, "doctor", "-c", name, "--check", "slurm")
    assert doctor.returncode == 0 and "[ok  ] slurm" in doctor.stdout, doctor.stdout + doctor.stderr


def test_a_replaced_node_rejoins_slurm_and_runs_work(cluster):
    name, env = cluster
    proc = ct(env, "replace", "-c", name, "node-4", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert sinfo(env, name)["node-4"][:2] == ("idle", f"gpu:{SLOTS}")
    ran = ct(env, "run", "-c", name, "--nodes", "node-4", "--launcher", "process", "--no-tag-output", "--follow", "--",
             "hostname")
    assert ran.returncode == 0 and "node-4" in ran.stdout, ran.stdout + ran.stderr
