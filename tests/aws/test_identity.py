"""Cluster identity against a moto server: ids and owners on every resource, teardown by id, names
other owners use refused, sweeps that never touch another owner's or an in-flight cluster, and
the local leftovers of a lost state removed with it.

"Two users" are two CLUSTERTOOL_HOMEs on one AWS account (moto answers every caller as the same
IAM user), which is exactly the case the home id tells apart."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws
UP = ("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--no-ssh")


def _tags(items) -> list[dict]:
    return [{t["Key"]: t["Value"] for t in i.get("Tags", i.get("TagSet", []))} for i in items]


def _sweep(aws, *flags: str, keeps: bool = False) -> dict:
    """``keeps``: a finished cluster that costs money is kept, so --yes exits 1 and says which."""
    import json

    code, out, err = aws.ct("down", "--sweep", "--yes", "--json", *flags)
    assert code == (1 if keeps else 0), err
    doc = json.loads(out)
    if keeps:
        assert doc["kept"].startswith("kept 1 cluster running at $"), doc
    return doc


def _as(monkeypatch, tmp_path, home: str) -> None:
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path / home))
    monkeypatch.setenv("CLUSTERTOOL_HOSTFILE_DIR", str(tmp_path / f"hostfiles-{home}"))


def test_everything_up_makes_carries_the_id_owner_home_and_a_finished_lease(aws, tmp_path):
    from clustertool.core import state

    name = unique("id")
    code, _, err = aws.ct(*UP, "--name", name)
    assert code == 0, err
    cluster = state.load(name)
    assert cluster.id.startswith(f"{name}-") and len(cluster.id) == len(name) + 7
    home = (tmp_path / "cthome" / "home-id").read_text().strip()
    flt = [{"Name": "tag:clustertool:cluster", "Values": [name]}]
    groups = aws.ec2.describe_security_groups(Filters=flt)["SecurityGroups"]
    keys = aws.ec2.describe_key_pairs(Filters=flt)["KeyPairs"]
    for values in _tags(aws.instances(name)) + _tags(groups) + _tags(keys):
        assert values["clustertool:id"] == cluster.id
        assert values["clustertool:owner"] == "arn:aws:sts::123456789012:user/moto"
        assert values["clustertool:home"] == home
    assert {v["clustertool:lease"] for v in _tags(aws.instances(name)) + _tags(groups)} == {"done"}
    assert state.read_marker(name)["id"] == cluster.id
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_up_refuses_a_name_another_owners_live_cluster_uses_and_makes_nothing(aws, tmp_path, monkeypatch):
    name = unique("train")
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct(*UP, "--name", name)[0] == 0
    _as(monkeypatch, tmp_path, "alice")
    start = len(aws.recorder.ops)
    code, _, err = aws.ct(*UP, "--name", name)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, err
    assert f"cluster name {name!r} is already used in us-east-1 by {name}-" in errors[0]
    assert "arn:aws:sts::123456789012:user/moto (home " in errors[0] and "up finished" in errors[0]
    assert not [op for op in aws.recorder.ops[start:] if op.startswith(("create", "run", "import"))]
    assert aws.leaks(name)["instances"] == 2  # bob's, untouched
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_down_goes_by_id_and_leaves_another_users_same_named_cluster_untouched(aws, tmp_path, monkeypatch):
    """Two same-named clusters of two homes (as two `up`s that passed each other's name check
    would leave them: the check is switched off here to make them); each down removes its own."""
    from clustertool.providers.aws import owner

    monkeypatch.setattr(owner, "check_name_free", lambda *a, **k: None)
    monkeypatch.setattr(owner, "check_race", lambda *a, **k: None)
    name = unique("train")
    _as(monkeypatch, tmp_path, "alice")
    assert aws.ct(*UP, "--name", name)[0] == 0
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct(*UP[:4], "3", *UP[5:], "--name", name)[0] == 0
    assert aws.leaks(name)["instances"] == 5
    _as(monkeypatch, tmp_path, "alice")
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert "terminated 2 instance(s)" in err and "terminated 5" not in err
    assert aws.leaks(name)["instances"] == 3 and aws.leaks(name)["security_groups"] == 2  # + the leader's
    swept = _sweep(aws, keeps=True)  # alice's sweep: bob's cluster is listed and kept
    assert [(s["name"], s["action"]) for s in swept["orphans"]] == [(name, "keep")]
    # one AWS identity, two homes: the sweep cannot tell two people on one IAM user from one person's two
    # machines, so it says exactly what it knows, and keeps it
    assert swept["orphans"][0]["why"].startswith("yours (this AWS identity), from another clustertool home")
    assert swept["removed"] == []
    assert aws.leaks(name)["instances"] == 3
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_down_of_a_cluster_another_owner_made_is_refused_unless_force_owner(aws, tmp_path, monkeypatch):
    """Bob's state file copied into alice's home: the tags say bob made it."""
    import shutil

    name = unique("copy")
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct(*UP, "--name", name)[0] == 0
    (tmp_path / "alice" / "clusters").mkdir(parents=True)
    shutil.copy(tmp_path / "bob" / "clusters" / f"{name}.json", tmp_path / "alice" / "clusters")
    _as(monkeypatch, tmp_path, "alice")
    for verb in (("down", "--yes"), ("stop",)):
        code, _, err = aws.ct(verb[0], "-c", name, *verb[1:])
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code != 0 and len(errors) == 1 and "belongs to arn:aws:sts::123456789012:user/moto (home" in errors[0]
        assert "--force-owner" in err
    assert aws.leaks(name)["instances"] == 2 and {i["State"]["Name"] for i in aws.instances(name)} == {"running"}
    code, _, err = aws.ct("down", "-c", name, "--yes", "--force-owner")
    assert code == 0, err
    assert aws.total_leaks(name) == 0


def test_sweep_of_a_lost_state_removes_the_cluster_and_its_key_lock_and_hostfile(aws, tmp_path):
    from clustertool.core import state

    name = unique("lost")
    assert aws.ct(*UP, "--name", name)[0] == 0
    cluster = state.load(name)
    hostfile = tmp_path / "hostfiles" / name
    assert hostfile.exists() and state.ClusterPaths(name).key.exists() and state.lock_path(name).exists()
    state.state_path(name).unlink()  # the state file is lost; key, lock and hostfile stay
    swept = _sweep(aws)
    [found] = swept["orphans"]
    assert (found["id"], found["action"], found["why"]) == (cluster.id, "delete", "this home's cluster whose "
                                                                                  "state is gone")
    assert found["owner"].startswith("arn:aws:sts::123456789012:user/moto (home ") and found["age_s"] >= 0
    assert aws.total_leaks(name) == 0
    assert not hostfile.exists() and not state.ClusterPaths(name).root.exists()
    assert not state.lock_path(name).exists()
    assert f"{name}: removed hostfile {hostfile}" in swept["local"]


def test_sweep_deletes_another_owners_complete_cluster_only_with_force_owner(aws, tmp_path, monkeypatch):
    name = unique("theirs")
    _as(monkeypatch, tmp_path, "bob")
    assert aws.ct(*UP, "--name", name)[0] == 0
    _as(monkeypatch, tmp_path, "alice")
    swept = _sweep(aws, keeps=True)
    assert [s["action"] for s in swept["orphans"]] == ["keep"] and aws.leaks(name)["instances"] == 2
    swept = _sweep(aws, "--force-owner")
    assert [s["action"] for s in swept["orphans"]] == ["delete"] and len(swept["removed"]) == 1
    assert aws.total_leaks(name) == 0
    assert (tmp_path / "bob" / "clusters" / f"{name}.json").exists()  # bob's files are bob's business


def test_sweep_never_deletes_a_cluster_whose_up_is_in_flight_and_that_up_then_succeeds(aws, tmp_path, monkeypatch):
    """While alice's `up` waits for status checks, bob sweeps the region (even with --force-owner)."""
    from clustertool.providers.aws import client, sweep

    name = unique("flight")
    seen = {}

    def sweep_meanwhile(service, op, kwargs, call):
        if op == "describe_instance_status" and not seen:
            home = os.environ["CLUSTERTOOL_HOME"]
            os.environ["CLUSTERTOOL_HOME"] = str(tmp_path / "bob")
            try:
                found = sweep.find(known_ids=(), known_names=(), force_owner=True)
                seen["found"] = found
                seen["removed"] = sweep.delete(found)
            finally:
                os.environ["CLUSTERTOOL_HOME"] = home
        return call()

    client.HOOKS.insert(0, sweep_meanwhile)
    _as(monkeypatch, tmp_path, "alice")
    code, _, err = aws.ct(*UP, "--name", name)
    assert code == 0, err
    mine = [s for s in seen["found"] if s.name == name]
    assert len(mine) == 1 and mine[0].action == "keep" and "up in flight" in mine[0].why
    assert seen["removed"] == [] and aws.leaks(name)["instances"] == 2
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
    assert aws.total_leaks(name) == 0


def test_up_fails_and_rolls_back_when_an_instance_terminates_during_the_status_wait(aws):
    """EC2 answers 'not-applicable' status checks for a terminated instance: not a pass."""
    from clustertool.core import state
    from clustertool.providers.aws import client

    killed = []

    def terminate_one(service, op, kwargs, call):
        if op == "describe_instance_status" and not killed:
            killed.append(kwargs["InstanceIds"][1])
            aws.ec2.terminate_instances(InstanceIds=killed)
        return call()

    client.HOOKS.insert(0, terminate_one)
    name = unique("gone")
    code, _, err = aws.ct(*UP, "--name", name)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, err
    assert f"{killed[0]} is terminated (Client.UserInitiatedShutdown" in errors[0]
    assert not state.exists(name) and aws.total_leaks(name) == 0


def test_up_fails_when_an_instance_is_stopped_before_the_end(aws):
    """Stopped after the waits passed: the final check of up catches it."""
    from clustertool.core import state
    from clustertool.providers.aws import client

    stopped = []

    def stop_one(service, op, kwargs, call):
        answer = call()
        if op == "get_console_output" and not stopped:
            stopped.append(kwargs["InstanceId"])
            aws.ec2.stop_instances(InstanceIds=stopped)
        return answer

    client.HOOKS.insert(0, stop_one)
    name = unique("stopd")
    code, _, err = aws.ct(*UP, "--name", name)
    assert code != 0 and f"{stopped[0]} is stopped" in err and "not every instance is running" in err
    assert not state.exists(name) and aws.total_leaks(name) == 0


def _hold_up_lock(home, name, ready, release):
    os.environ["CLUSTERTOOL_HOME"] = home
    from clustertool.core import state

    with state.locked(name, purpose="up"):
        ready.set()
        release.wait(20)


def test_a_second_up_of_a_name_being_created_is_refused_naming_the_pid_and_makes_nothing(aws):
    name = unique("twin")
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    proc = multiprocessing.Process(target=_hold_up_lock, args=(os.environ["CLUSTERTOOL_HOME"], name, ready, release))
    proc.start()
    try:
        assert ready.wait(10)
        start = len(aws.recorder.ops)
        code, _, err = aws.ct(*UP, "--name", name)
        assert code != 0 and f"error: cluster {name!r} is being created by pid {proc.pid}" in err
        assert aws.recorder.ops[start:] == []  # not one AWS call
        code, _, err = aws.ct("down", "-c", name)   # without --yes (and no terminal): not stopped
        assert code != 0 and f"refusing to stop the `up` of {name!r} (pid {proc.pid}) without --yes" in err, err
        code, out, err = aws.ct("down", "-c", name, "--yes")   # ours: stopped, and nothing was made
        assert code == 0 and f"(pid {proc.pid})" in out and "nothing of cluster" in out, err
    finally:
        if proc.is_alive():  # a holder stopped inside Event.wait leaves the event's lock taken: leave it be
            release.set()
        proc.join(10)
    assert aws.total_leaks(name) == 0


def test_nodes_100000_is_refused_by_the_quota_before_anything_is_made(aws):
    """moto's Service Quotas knows no EC2 quota, so the EC2 account attribute (max-instances=20) decides."""
    name = unique("huge")
    code, _, err = aws.ct("up", "-p", "aws", "--nodes", "100000", "--instance-type", "p4d.24xlarge",
                          "--name", name, "--no-ssh")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, err
    assert "--nodes 100000 x p4d.24xlarge needs 100,000 instances" in errors[0] and "max-instances" in errors[0]
    assert not [op for op in aws.recorder.ops if op.startswith(("create", "run", "import"))]


def test_the_vcpu_quota_from_service_quotas_counts_what_already_runs(aws):
    """Service Quotas answered at the seam (moto has no EC2 quotas): P quota 384 vCPUs = 4 x p4d."""
    from clustertool.providers.aws import client

    asked = []

    def p_quota(service, op, kwargs, call):
        if op == "get_service_quota":
            asked.append(kwargs["QuotaCode"])
            return {"Quota": {"QuotaCode": kwargs["QuotaCode"], "Value": 384.0}}
        return call()

    client.HOOKS.insert(0, p_quota)
    first = unique("q")
    code, out, _ = aws.ct(*UP, "--name", first, "--dry-run")
    assert code == 0 and "Running On-Demand P instances (L-417A185B): 384 vCPUs (Service Quotas), 0 in use, " \
                         "this cluster needs 192" in out
    assert aws.ct(*UP, "--name", first)[0] == 0
    code, _, err = aws.ct("up", "-p", "aws", "-N", "3", "--instance-type", "p4d.24xlarge", "--name", unique("q"),
                          "--no-ssh")
    assert code != 0 and "needs 288 vCPUs" in err and "is 384 with 192 in use (192 free" in err
    assert asked[0] == "L-417A185B"
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--name", unique("q"),
                  "--no-ssh", "--spot", "--dry-run")[0] == 0
    assert asked[-1] == "L-3819A6DF"  # G spot
    assert aws.ct("down", "-c", first, "--yes")[0] == 0
