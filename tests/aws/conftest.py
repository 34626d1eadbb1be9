"""A real moto server for the aws tier: started once per session on 127.0.0.1 and a free port,
reset before every test; the tool reaches it over HTTP through AWS_ENDPOINT_URL."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.aws import fakes

pytestmark = pytest.mark.aws
MY_IP = "203.0.113.9"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_url():
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e .[test])")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/data.json", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class World:
    """The test's view of AWS (boto3 only to ASSERT on what exists) and its seam hooks."""

    def __init__(self, url: str, capsys):
        import boto3

        self.url, self.capsys = url, capsys
        self.ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
        self.pgs = fakes.FakePlacementGroups()
        self.faults = fakes.Faults()
        self.recorder = fakes.Recorder()

    def ct(self, *args: str) -> tuple[int, str, str]:
        """Run the tool's own CLI in-process; returns (exit code, stdout, stderr)."""
        from clustertool.cli import app

        self.capsys.readouterr()
        code = app.run(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def leaks(self, cluster: str) -> dict[str, int]:
        """Tagged resources of ``cluster`` that still exist (instances: not terminated)."""
        flt = [{"Name": "tag:clustertool:cluster", "Values": [cluster]}]
        live = flt + [{"Name": "instance-state-name",
                       "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}]
        instances = [i for r in self.ec2.describe_instances(Filters=live)["Reservations"] for i in r["Instances"]]
        return {
            "instances": len(instances),
            "security_groups": len(self.ec2.describe_security_groups(Filters=flt)["SecurityGroups"]),
            "key_pairs": len(self.ec2.describe_key_pairs(Filters=flt)["KeyPairs"]),
            "volumes": len(self.ec2.describe_volumes(Filters=flt)["Volumes"]),
            "placement_groups": len(self.pgs.tagged(cluster)),
            "network_interfaces": len(self.interfaces(cluster)),
            "addresses": len(self.ec2.describe_addresses(Filters=flt)["Addresses"]),
        }

    def interfaces(self, cluster: str) -> set[str]:
        """Network interfaces of the cluster: tagged ones, and those attached to any of its instances
        (terminated ones too: moto, unlike EC2, keeps a terminated instance's secondary interfaces)."""
        return cluster_interfaces(self.ec2, cluster)

    def total_leaks(self, cluster: str) -> int:
        return sum(self.leaks(cluster).values())

    def instances(self, cluster: str) -> list[dict]:
        flt = [{"Name": "tag:clustertool:cluster", "Values": [cluster]},
               {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]}]
        return [i for r in self.ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]


def cluster_interfaces(ec2, cluster: str) -> set[str]:
    flt = [{"Name": "tag:clustertool:cluster", "Values": [cluster]}]
    found = {e["NetworkInterfaceId"] for e in ec2.describe_network_interfaces(Filters=flt)["NetworkInterfaces"]}
    ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]
    if ids:
        attached = ec2.describe_network_interfaces(Filters=[{"Name": "attachment.instance-id", "Values": ids}])
        found |= {e["NetworkInterfaceId"] for e in attached["NetworkInterfaces"]}
    return found


@pytest.fixture
def aws(moto_url, ct_env, tmp_path, monkeypatch, capsys):
    """A clean moto account, fake credentials, fast polling, per-test clustertool home.

    The provider's client seam (``client.HOOKS``) gets: a call recorder, a fault injector
    (empty unless a test adds rules) and ``FakePlacementGroups``, because moto's server does not
    implement placement groups; every other call reaches the moto server over HTTP."""
    urllib.request.urlopen(urllib.request.Request(moto_url + "/moto-api/reset", method="POST"), timeout=10).read()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE", "SSH_CONNECTION"):
        monkeypatch.delenv(key, raising=False)
    env = {
        "AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-creds"),
        "CLUSTERTOOL_AWS_POLL": "0.01", "CLUSTERTOOL_AWS_TIMEOUT": "20", "CLUSTERTOOL_AWS_MAX_ATTEMPTS": "2",
        "CLUSTERTOOL_MY_IP": MY_IP,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    world = World(moto_url, capsys)
    from clustertool.providers.aws import client

    monkeypatch.setattr(client, "HOOKS", [world.recorder, world.faults, world.pgs])
    return world


@pytest.fixture
def ec2front(aws, moto_url, monkeypatch):
    """The stand-in for the EC2 calls moto lacks (tests/aws/ec2front.py), in front of the moto server:
    the tool's calls go through it (AWS_ENDPOINT_URL); ``aws.ec2`` still asks moto directly."""
    from tests.aws.ec2front import Ec2Front

    front = Ec2Front(moto_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", front.url)
    yield front
    front.close()
