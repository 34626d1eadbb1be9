"""`up --provider aws --scheduler slurm` against a moto server, through the CLI: the plan says which Slurm
release the image brings; every node's user data installs the packages at first boot and keeps their daemons
stopped until the setup (over SSH) gives them the cluster's key and config; the key is never in user data;
a replaced node gets the same user data; `down` leaves nothing.  (moto's instances answer no SSH: `--no-ssh`,
so the setup itself is the local tier's to test; here the record says Slurm was never set up.)"""

from __future__ import annotations

import base64

import pytest

from clustertool.core import state
from tests.conftest import unique

pytestmark = pytest.mark.aws


def user_data(aws, instance_id: str) -> str:
    found = aws.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]
    return base64.b64decode(found.get("Value", "")).decode()


def test_the_plan_names_the_slurm_release_the_image_brings(aws):
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--scheduler", "slurm",
                            "--dry-run", "--name", unique("sp"))
    assert code == 0, err
    assert "slurm: the image's own packages" in out and "Slurm 21.08 on the default Ubuntu 22.04" in out
    assert "slurmctld on the leader, slurmd on every worker, the leader too" in out
    assert "systemd (the units are enabled)" in out


def test_every_node_installs_slurm_at_first_boot_and_never_gets_the_key_in_user_data(aws):
    name = unique("sl")
    code, out, err = aws.ct("up", "-p", "aws", "-N", "2", "--instance-type", "g5.xlarge", "--scheduler", "slurm",
                            "--no-ssh", "--name", name)
    assert code == 0, err
    assert "slurm: packages only (--no-ssh" in err
    key = (state.ClusterPaths(name).root / "munge.key")
    assert not key.exists()  # made only when a setup sends it (over SSH, on stdin)
    for inst in aws.instances(name):
        text = user_data(aws, inst["InstanceId"])
        assert text.startswith("#cloud-config\n") and "packages:\n  - munge\n  - slurmd\n" in text
        assert "  - [systemctl, disable, --now, munge, slurmd, slurmctld]" in text
        assert "munge.key" not in text
    record = state.load(name).to_dict()
    assert record["scheduler"] == {"kind": "slurm", "made": True, "ready": False, "leader_compute": True}
    code, _, err = aws.ct("run", "-c", name, "--", "hostname")
    assert code != 0 and err.startswith("error: cluster") and "not ready for SSH" in err
    code, _, err = aws.ct("down", "-c", name, "--yes")
    assert code == 0, err
    assert aws.total_leaks(name) == 0


def test_a_cluster_without_slurm_gets_no_slurm_packages(aws):
    name = unique("ns")
    code, _, err = aws.ct("up", "-p", "aws", "-N", "1", "--instance-type", "g5.xlarge", "--no-ssh", "--name", name)
    assert code == 0, err
    assert all("slurmd" not in user_data(aws, i["InstanceId"]) for i in aws.instances(name))
    assert aws.ct("down", "-c", name, "--yes")[0] == 0
