"""`sync-s3` on a real 4-node local cluster (sshd in namespaces) against a moto server on the bridge.

This machine lists and presigns; nodes download the presigned URLs over the cluster network and
never hold a credential.  moto checks neither the expiry of presigned URLs nor any denial, so the
per-node error test puts tests/fakes/s3proxy.py in front of moto (on a second bridge address that
one node has no route to): it expires URLs for real (X-Amz-Date + X-Amz-Expires, as S3), denies
one object and deletes another between listing and download.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fakes.s3proxy import S3Proxy
from tests.local.conftest import CREDS, KEYS, provider_state

pytestmark = [pytest.mark.local, pytest.mark.aws]
NODES = ("node-1", "node-2", "node-3", "node-4")
BOOT_MARK = b'"<clustertool>"'  # in the command line of every node program started by a session


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
    return sorted((f"{k[3:]} {5000 + 1000 * i}" for i, k in enumerate(KEYS)), key=lambda s: s.encode())


def _netns(name):
    return [f"ct-{name}-{i}" for i in range(1, 5)]


def _node_processes(name) -> dict[int, tuple[bytes, bytes]]:
    """Every process in the cluster's namespaces: pid -> (environ, cmdline)."""
    out = {}
    for ns in _netns(name):
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                out[int(pid)] = (Path(f"/proc/{pid}/environ").read_bytes(), Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass  # it ended meanwhile
    return out


def _secrets():
    return [CREDS["AWS_SECRET_ACCESS_KEY"].encode(), CREDS["AWS_ACCESS_KEY_ID"].encode()]


def test_no_credentials_reach_any_node_while_every_node_pulls_everything_then_nothing_on_rerun(s3_cluster):
    """The done-when test: the cluster is brought up and sync-s3 run with this run's own AWS keys in
    the environment; the nodes' processes (environment, command line) are read while the node
    programs download, and every file under the nodes' homes, /scratch and /tmp afterwards."""
    name, endpoint, env, client = s3_cluster
    for i in range(4):
        client.put_object(Bucket="train-data", Key=f"slow/{i}.bin", Body=bytes([i]) * (1 << 20))
    with S3Proxy(endpoint.split("//")[1].split(":")[0], endpoint) as proxy:
        proxy.rules.rate = 1 << 20  # ~2 s per node with 2 threads: long enough to look at its processes
        proc = subprocess.Popen(
            [sys.executable, "-m", "clustertool", "sync-s3", "-c", name, "s3://train-data/slow", "/scratch/slow",
             "--endpoint-url", proxy.url, "--threads", "2", "--json"],
            env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
        seen, programs = {}, set()
        while proc.poll() is None:
            for pid, (environ, cmdline) in _node_processes(name).items():
                seen[pid] = (environ, cmdline)
                if BOOT_MARK in cmdline:
                    programs.add(pid)
            time.sleep(0.1)
        out, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        signed = [k for _, k, _ in proxy.rules.gets]
    assert len(programs) >= 4, "the node programs were never seen running"
    assert len(signed) == 16  # 4 objects x 4 nodes, each a presigned GET
    for pid, (environ, cmdline) in seen.items():
        for secret in _secrets():
            assert secret not in environ and secret not in cmdline, f"pid {pid} carries a credential"
    nodes_dir = Path(provider_state(env, name)["nodes_dir"])
    written = 0
    for path in nodes_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            written += 1
            assert not any(s in data for s in _secrets()), f"{path} holds a credential"
    assert written > 4 * 4  # homes (with the sync manifests), /scratch data, /tmp: really looked at
    assert [n["downloaded"] for n in json.loads(out)["nodes"]] == [4] * 4

    code, data, err = _sync(env, name, "s3://train-data/ds/", "/scratch/ds", "--endpoint-url", endpoint)
    assert code == 0, err
    assert [(n["downloaded"], n["verified"]) for n in data["nodes"]] == [(len(KEYS), len(KEYS))] * 4
    for node in NODES:
        assert _files(env, name, node, "/scratch/ds") == _expected()
    code, again, _ = _sync(env, name, "s3://train-data/ds", "/scratch/ds", "--endpoint-url", endpoint)
    assert code == 0 and [(n["downloaded"], n["up_to_date"]) for n in again["nodes"]] == [(0, len(KEYS))] * 4


def test_shard_gives_each_node_a_disjoint_part_that_covers_the_prefix(s3_cluster):
    name, endpoint, env, _ = s3_cluster
    env = dict(env, AWS_ENDPOINT_URL=endpoint)  # honoured without --endpoint-url
    code, data, err = _sync(env, name, "s3://train-data/ds/", "/scratch/sh", "--shard")
    assert code == 0, err
    seen = []
    for node in NODES:
        files = _files(env, name, node, "/scratch/sh")
        assert 2 <= len(files) <= 3, (node, files)
        seen += files
    assert sorted(seen) == sorted(_expected()) and len(set(seen)) == len(KEYS)
    assert [n["shard"] for n in data["nodes"]] == [[i, 4] for i in range(4)]


@pytest.fixture
def second_address(s3_cluster):
    """A second address of this machine on the cluster bridge that nodes 1, 2 and 4 reach (a /32
    route and the bridge's MAC, as they reach the bridge's own address) and node-3 has no route to."""
    name, _, env, _ = s3_cluster
    bridge = provider_state(env, name)["bridge"]
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True).stdout
    address = out.split()[3].split("/")[0].rsplit(".", 1)[0] + ".253"
    mac = subprocess.run(["cat", f"/sys/class/net/{bridge}/address"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", bridge], check=True)
    try:
        for index in (1, 2, 4):
            ns = ["ip", "netns", "exec", f"ct-{name}-{index}", "ip"]
            subprocess.run(ns + ["route", "add", f"{address}/32", "dev", "eth0"], check=True)
            subprocess.run(ns + ["neigh", "replace", address, "lladdr", mac, "dev", "eth0", "nud", "permanent"],
                           check=True)
        subprocess.run(["ip", "netns", "exec", f"ct-{name}-3", "ip", "route", "add", "unreachable",
                        f"{address}/32"], check=True)
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", bridge], capture_output=True)


def test_bad_objects_expired_urls_and_an_unreachable_endpoint_are_one_line_per_node(s3_cluster, second_address):
    name, endpoint, env, client = s3_cluster
    with S3Proxy(second_address, endpoint, client) as proxy:
        proxy.rules.denied.add(KEYS[0])
        proxy.rules.delete_on_get.add(KEYS[1])
        proxy.rules.rate = 10_000  # bytes/s: one object at a time takes ~9 s, URLs live 6 s
        code, data, err = _sync(env, name, "s3://train-data/ds", "/scratch/bad", "--endpoint-url", proxy.url,
                                "--threads", "1", "--url-expiry", "6")
        statuses = [s for _, _, s in proxy.rules.gets]
    assert code == 1
    by = {n["node"]: n for n in data["nodes"]}
    assert by["node-3"]["status"] == "failed" and by["node-3"]["downloaded"] == 0
    assert by["node-3"]["error"] == f"cannot reach {proxy.url}: No route to host"
    for node in ("node-1", "node-2", "node-4"):
        n = by[node]
        assert n["status"] == "failed" and n["downloaded"] == len(KEYS) - 2 and n["renewals"] >= 1, n
        assert sorted(n["errors"]) == [f"{KEYS[0][3:]}: denied (403 AccessDenied: Access Denied)",
                                       f"{KEYS[1][3:]}: gone since the listing (404 NoSuchKey)"]
        assert _files(env, name, node, "/scratch/bad") == [
            f for f in _expected() if not f.startswith(("part 00", "part 01"))]
    assert statuses.count(403) > 3  # the denials and at least one real expiry per node


def test_a_changed_object_is_downloaded_again_and_the_table_names_each_node(s3_cluster):
    name, endpoint, env, client = s3_cluster
    args = ("s3://train-data/ds/sub/", "/scratch/u", "--endpoint-url", endpoint, "-n", "node-2")
    assert _sync(env, name, *args)[0] == 0
    time.sleep(1.1)  # LastModified has one-second resolution
    client.put_object(Bucket="train-data", Key="ds/sub/more/x.bin", Body=b"new and longer content")
    code, data, _ = _sync(env, name, *args)
    assert code == 0 and data["nodes"][0]["downloaded"] == 1 and data["nodes"][0]["up_to_date"] == 1
    assert "more/x.bin 22" in _files(env, name, "node-2", "/scratch/u")
    table = run_cli("sync-s3", "-c", name, *args, "--pass-credentials", env=env)
    assert table.returncode == 0
    assert "note: --pass-credentials does nothing now" in table.stderr
    assert "node-2" in table.stdout and "sync-s3 s3://train-data/ds/sub/" in table.stdout



def test_ctrl_c_stops_every_node_program_and_the_next_run_resumes_their_partial_files(s3_cluster):
    name, endpoint, env, client = s3_cluster
    body = bytes(range(256)) * 4096  # 1 MiB
    for i in range(4):
        client.put_object(Bucket="train-data", Key=f"slow/{i}.bin", Body=body)
    with S3Proxy(endpoint.split("//")[1].split(":")[0], endpoint) as proxy:
        proxy.rules.rate = 256 << 10  # 4 s per object: still downloading at Ctrl-C
        proc = subprocess.Popen([sys.executable, "-m", "clustertool", "sync-s3", "-c", name, "s3://train-data/slow",
                                 "/scratch/cc", "--endpoint-url", proxy.url, "--threads", "2"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=Path(__file__).resolve().parents[2])
        deadline = time.monotonic() + 30
        while len(proxy.rules.gets) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        proc.send_signal(2)  # SIGINT, as Ctrl-C
        assert proc.wait(timeout=30) == 130, proc.communicate()[1].decode()[-6000:]
        deadline = time.monotonic() + 10
        while any(BOOT_MARK in cmd for _, cmd in _node_processes(name).values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(BOOT_MARK in cmd for _, cmd in _node_processes(name).values()), "a node program runs on"
    code, data, err = _sync(env, name, "s3://train-data/slow", "/scratch/cc", "--endpoint-url", endpoint)
    assert code == 0, err
    for n in data["nodes"]:
        assert n["downloaded"] == 4 and n["verified"] == 4 and n["bytes_resumed"] > 0, n
        assert n["bytes_downloaded"] + n["bytes_resumed"] == 4 << 20
    assert _files(env, name, "node-4", "/scratch/cc") == [f"{i}.bin {1 << 20}" for i in range(4)]
