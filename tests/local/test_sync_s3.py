"""`sync-s3` on a real local cluster against a moto server on the cluster's bridge address."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.conftest import run_cli
from tests.local.conftest import KEYS

pytestmark = [pytest.mark.local, pytest.mark.aws]

def _sync(env, name, *args):
    proc = run_cli("sync-s3", "-c", name, *args, "--json", env=env)
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        raise AssertionError(f"no JSON (exit {proc.returncode}): {proc.stdout}{proc.stderr}") from None


def _files(env, name, node, dest):
    line = f"cd {shlex.quote(dest)} && find . -type f -printf '%P %s\\n' | LC_ALL=C sort"
    proc = run_cli("exec", "-c", name, "-n", node, "--no-live", "--", line, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("\n", 1)[1].splitlines()


def _expected():
    return sorted(f"{k[3:]} {5000 + 1000 * i}" for i, k in enumerate(KEYS))


def test_every_node_pulls_everything_via_endpoint_env_then_nothing_on_rerun(s3_cluster):
    name, endpoint, env, _ = s3_cluster
    env = dict(env, AWS_ENDPOINT_URL=endpoint)  # honoured without --endpoint-url
    code, data, err = _sync(env, name, "s3://train-data/ds/", "/scratch/ds", "--pass-credentials")
    assert code == 0, err
    assert [n["downloaded"] for n in data["nodes"]] == [len(KEYS)] * 4
    assert all(n["verified"] == len(KEYS) for n in data["nodes"])
    for node in ("node-1", "node-2", "node-3", "node-4"):
        assert _files(env, name, node, "/scratch/ds") == sorted(_expected(), key=lambda s: s.encode())
    code, again, _ = _sync(env, name, "s3://train-data/ds/", "/scratch/ds", "--pass-credentials")
    assert code == 0 and [n["downloaded"] for n in again["nodes"]] == [0] * 4


def test_shard_gives_each_node_a_disjoint_part_that_covers_the_prefix(s3_cluster):
    name, endpoint, env, _ = s3_cluster
    code, data, err = _sync(env, name, "s3://train-data/ds/", "/scratch/sh", "--shard",
                            "--endpoint-url", endpoint, "--pass-credentials")
    assert code == 0, err
    seen = []
    for node in ("node-1", "node-2", "node-3", "node-4"):
        files = _files(env, name, node, "/scratch/sh")
        assert 2 <= len(files) <= 3, (node, files)
        seen += files
    assert sorted(seen) == sorted(_expected()) and len(set(seen)) == len(KEYS)
    assert [n["shard"] for n in data["nodes"]] == [[i, 4] for i in range(4)]


def test_missing_bucket_and_bad_credentials_are_per_node_errors(s3_cluster):
    name, endpoint, env, _ = s3_cluster
    code, data, _ = _sync(env, name, "s3://no-such-bucket/x", "/scratch/n", "--endpoint-url", endpoint,
                          "--pass-credentials", "-n", "node-2")
    assert code == 1 and "NoSuchBucket" in data["nodes"][0]["error"]
    # without --pass-credentials the nodes use their own chain: these nodes have none
    # (instance metadata disabled, so nothing is sent outside the cluster's own range)
    env = dict(env, AWS_EC2_METADATA_DISABLED="true")
    code, data, _ = _sync(env, name, "s3://train-data/ds", "/scratch/n", "--endpoint-url", endpoint, "-n", "node-3")
    assert code == 1 and "no AWS credentials on this node" in data["nodes"][0]["error"]


def test_changed_object_is_downloaded_again(s3_cluster):
    name, endpoint, env, client = s3_cluster
    args = ("s3://train-data/ds/sub/", "/scratch/u", "--endpoint-url", endpoint, "--pass-credentials", "-n", "node-2")
    assert _sync(env, name, *args)[0] == 0
    client.put_object(Bucket="train-data", Key="ds/sub/more/x.bin", Body=b"new and longer content")
    code, data, _ = _sync(env, name, *args)
    assert code == 0 and data["nodes"][0]["downloaded"] == 1
    assert "more/x.bin 22" in _files(env, name, "node-2", "/scratch/u")
