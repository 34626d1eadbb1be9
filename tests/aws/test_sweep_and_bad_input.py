"""`down --sweep` finds and removes orphans; bad input is one clear line, exit != 0, no traceback."""

from __future__ import annotations

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.aws


def test_sweep_finds_and_deletes_clusters_this_home_lost_only(aws):
    from clustertool.core import state

    kept, orphaned = unique("kept"), unique("orph")
    up = ("up", "-p", "aws", "-N", "2", "--instance-type", "g4dn.12xlarge", "--no-ssh")
    assert aws.ct(*up, "--name", kept)[0] == 0
    assert aws.ct(*up, "--name", orphaned)[0] == 0
    state.state_path(orphaned).unlink()  # this machine no longer knows it
    code, out, err = aws.ct("down", "--sweep", "--json")
    assert code != 0 and "without --yes" in err  # no terminal to confirm on
    assert aws.total_leaks(orphaned) > 0
    code, out, err = aws.ct("down", "--sweep", "--yes")
    assert code == 0, err
    assert orphaned in out and kept not in out and "removed 1 cluster(s)" in out
    assert aws.total_leaks(orphaned) == 0
    assert aws.leaks(kept)["instances"] == 2 and aws.leaks(kept)["security_groups"] == 2  # + the leader's
    code, out, _ = aws.ct("down", "--sweep", "--yes")
    assert code == 0 and "no orphaned clustertool resources" in out
    assert aws.ct("down", "-c", kept, "--yes")[0] == 0
    assert aws.total_leaks(kept) == 0


def test_a_sweep_from_a_new_home_names_your_cluster_with_its_cost_and_fails_under_yes(aws, monkeypatch, tmp_path):
    """The clustertool home was lost: the sweep keeps the user's running cluster but says whose it is and
    what it costs, and a script running it with --yes gets a non-zero exit; --any-home deletes it."""
    import json

    name = unique("mine")
    assert aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--no-ssh", "--name", name)[0] == 0
    from clustertool.core import state

    cluster_id = state.load(name).id
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path / "new-home"))   # the same AWS identity, a new home
    code, out, err = aws.ct("down", "--sweep", "--yes")
    assert code == 1, err   # something billable was kept: a script notices
    last = out.strip().splitlines()[-1]
    assert last == (f"kept 1 cluster running at $65.55/h: {cluster_id} (yours, from another clustertool home); "
                    "--any-home deletes yours"), out
    assert "yours (this AWS identity), from another clustertool home" in out and "65.55" in out
    assert aws.leaks(name)["instances"] == 2
    code, out, err = aws.ct("down", "--sweep", "--yes", "--json")
    assert code == 1 and json.loads(out)["kept"].startswith("kept 1 cluster running at $65.55/h")
    code, out, err = aws.ct("down", "--sweep", "--any-home", "--yes")
    assert code == 0, err
    assert "removed 1 cluster(s)" in out and aws.total_leaks(name) == 0


@pytest.mark.parametrize("args, expected", [
    (("--instance-type", "p9.bogus"), "unknown instance type 'p9.bogus'"),
    (("--instance-type", "p4d.24xlarge", "--az", "us-east-1e"), "--az us-east-1e does not offer p4d.24xlarge"),
    (("--instance-type", "p4d.24xlarge", "--ssh-cidr", "10.0.0.300/8"), "--ssh-cidr: '10.0.0.300/8' is not"),
    (("--instance-type", "p4d.24xlarge", "--iops", "50000"), "--iops: gp3 takes 3000-16000 IOPS"),
    (("--instance-type", "g4dn.xlarge", "--efa"), "--efa: g4dn.xlarge does not support EFA"),
    (("--instance-type", "p4d.24xlarge", "--ami", "ami-12345678"), "image ami-12345678 not found"),
    (("--instance-type", "p4d.24xlarge", "--key-name", "nosuchkey"), "--key-name nosuchkey: no such key pair"),
    (("--nodes", "2"), "--instance-type is required"),
])
def test_bad_input_is_one_clear_line_and_creates_nothing(aws, args, expected):
    name = unique("bad")
    base = ["up", "-p", "aws", "--name", name, "--no-ssh"]
    if "--nodes" not in args:
        base += ["--nodes", "2"]
    code, out, err = aws.ct(*base, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and "Traceback" not in err
    assert len(errors) == 1 and expected in errors[0], err
    assert len(errors[0]) < 160, errors[0]   # one line a terminal shows whole
    assert aws.total_leaks(name) == 0
    assert not [op for op in aws.recorder.ops if op.startswith(("create", "run", "import"))]


def test_no_credentials_is_one_line_with_a_hint(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", unique("nc"),
                          "--no-ssh")
    assert code != 0 and "Traceback" not in err
    assert err.splitlines()[-2:] == ["error: no AWS credentials found", err.splitlines()[-1]]
    assert err.splitlines()[-1].startswith("hint: configure them")


def test_unknown_caller_address_refuses_instead_of_opening_ssh_to_the_world(aws, monkeypatch):
    from clustertool.providers.aws import network

    monkeypatch.delenv("CLUSTERTOOL_MY_IP")
    monkeypatch.setattr(network, "_route_source", lambda: "10.1.2.3")  # a private address: not usable
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", unique("ip"),
                          "--no-ssh")
    assert code != 0 and "cannot tell which address you connect from" in err and "--ssh-cidr" in err
    assert not [op for op in aws.recorder.ops if op.startswith(("create", "run", "import"))]


def test_not_authorized_and_throttling_become_one_line_with_hints(aws):
    from tests.aws.fakes import client_error

    aws.faults.add("describe_instance_types", client_error("UnauthorizedOperation", "DescribeInstanceTypes",
                                                           "You are not authorized to perform this operation."))
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", unique("au"),
                          "--no-ssh")
    assert code != 0 and "UnauthorizedOperation" in err and "hint: the IAM identity lacks" in err
    aws.faults.add("describe_instance_type_offerings", client_error("RequestLimitExceeded", "X", "Rate exceeded"))
    code, _, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "p4d.24xlarge", "--name", unique("th"),
                          "--no-ssh")
    assert code != 0 and "RequestLimitExceeded" in err and "throttling" in err
