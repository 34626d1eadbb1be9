"""sync-s3's whole conversation without ssh or root, against a real moto server over HTTP.

This machine lists and presigns with boto3; every "node" is a folder where nodeprogs/s3.py runs for
real (tests/fakes/transport.py runs the node command as a local process, HOME = the node's folder)
and downloads by HTTP.  moto honours presigned URLs but enforces neither their expiry nor any
denial, so those cases go through tests/fakes/s3proxy.py, an HTTP proxy in front of moto that
answers as S3 does (403 "Request has expired" once X-Amz-Date + X-Amz-Expires is past, 403 Access
Denied, a deletion between listing and download).  The same over real sshd: tests/local/test_sync_s3.py.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request
from types import SimpleNamespace

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.nodeprogs.s3lib import partial_name
from clustertool.transfer.s3 import sync_s3
from clustertool.transfer.transferrequests import SyncS3Request
from tests.fakes.cluster import saved_cluster
from tests.fakes.s3proxy import S3Proxy
from tests.fakes.transport import ScriptedTransport

pytestmark = pytest.mark.aws

MiB = 1 << 20
PARTS = [bytes([7]) * (5 * MiB), bytes([8]) * (5 * MiB), b"tail" * 300]
OBJECTS = {
    "ds/a.bin": b"a" * 5000,
    "ds/sub/b t ü.txt": b"hello\n" * 100,
    "ds/big.bin": os.urandom(3 * MiB),
    "ds/empty": b"",
}


def _put_multipart(client, key):
    upload = client.create_multipart_upload(Bucket="data", Key=key)["UploadId"]
    done = [{"PartNumber": n, "ETag": client.upload_part(Bucket="data", Key=key, UploadId=upload, PartNumber=n,
                                                         Body=body)["ETag"]} for n, body in enumerate(PARTS, 1)]
    client.complete_multipart_upload(Bucket="data", Key=key, UploadId=upload, MultipartUpload={"Parts": done})


@pytest.fixture
def s3(moto_url, ct_env, tmp_path, monkeypatch):
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    urllib.request.urlopen(urllib.request.Request(moto_url + "/moto-api/reset", method="POST"), timeout=10).read()
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket="data")
    for key, body in OBJECTS.items():
        client.put_object(Bucket="data", Key=key, Body=body)
    _put_multipart(client, "ds/multi.bin")
    client.put_object(Bucket="data", Key="ds/kms.bin", Body=b"k" * 999, ServerSideEncryption="aws:kms")
    saved_cluster("s3", 3)
    fake = ScriptedTransport(tmp_path / "nodes")
    with S3Proxy("127.0.0.1", moto_url, client) as proxy:
        def run(url="s3://data/ds", dest="ds", on_progress=None, selection=None, **kw):
            request = SyncS3Request(url, dest, nodes=selection, endpoint_url=proxy.url, **kw)
            return sync_s3(ClusterSession.load("s3", transport=fake), request, on_progress=on_progress)
        yield SimpleNamespace(client=client, fake=fake, proxy=proxy, run=run, home=fake.home)


def _expected():
    want = {k[3:]: v for k, v in OBJECTS.items()}
    want["multi.bin"] = b"".join(PARTS)
    want["kms.bin"] = b"k" * 999
    return want


def _tree(root):
    """Every regular file under root, relative name -> bytes (partial files included: none expected)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def test_every_node_gets_every_object_verified_in_the_stream_and_a_rerun_downloads_nothing(s3):
    seen = []
    result = s3.run(on_progress=lambda node, done, total: seen.append((node, done, total)))
    assert result.exit_code == 0, [n.error for n in result.nodes]
    size = sum(len(v) for v in _expected().values())
    for n in result.nodes:
        assert _tree(s3.home(n.node) / "ds") == _expected()
        # MD5 for single-part objects, MD5 of the parts' MD5s for multi.bin; SSE-KMS ETags are no MD5
        assert (n.downloaded, n.verified, n.size_only, n.bytes_downloaded) == (6, 5, 1, size)
        assert (n.node, size, size) in seen
    again = s3.run()
    assert again.exit_code == 0
    assert [(n.downloaded, n.up_to_date, n.bytes_downloaded) for n in again.nodes] == [(0, 6, 0)] * 3
    got = [k for _, k, _ in s3.proxy.rules.gets]
    assert len(got) == 3 * 5  # the re-run fetched nothing; an empty object needs no GET


def test_shard_gives_each_node_a_disjoint_part_that_covers_the_prefix(s3):
    result = s3.run(shard=True)
    assert result.exit_code == 0
    trees = [_tree(s3.home(n.node) / "ds") for n in result.nodes]
    assert sorted(k for t in trees for k in t) == sorted(_expected())
    assert [n.shard for n in result.nodes] == [[0, 3], [1, 3], [2, 3]]


def test_an_interrupted_download_resumes_from_its_partial_file_by_range(s3):
    etag = s3.client.head_object(Bucket="data", Key="ds/big.bin")["ETag"].strip('"')
    part = s3.home("node-1") / "ds" / partial_name("big.bin", etag)
    part.parent.mkdir(parents=True)
    part.write_bytes(OBJECTS["ds/big.bin"][:MiB])
    result = s3.run(selection="node-1")
    node = result.nodes[0]
    assert node.status == "ok" and node.bytes_resumed == MiB
    assert node.bytes_downloaded == sum(len(v) for v in _expected().values()) - MiB
    assert (s3.home("node-1") / "ds" / "big.bin").read_bytes() == OBJECTS["ds/big.bin"] and not part.exists()


def test_a_transfer_dropped_halfway_goes_on_by_range_in_the_same_run(s3):
    s3.proxy.rules.cut_once.add("ds/big.bin")
    node = s3.run(selection="node-1").nodes[0]
    assert node.status == "ok" and node.verified == 5
    assert node.bytes_downloaded == sum(len(v) for v in _expected().values())  # no byte twice
    half = len(OBJECTS["ds/big.bin"]) // 2
    assert [r for k, r in s3.proxy.rules.ranges if k == "ds/big.bin"] == [None, f"bytes={half}-"]
    assert (s3.home("node-1") / "ds" / "big.bin").read_bytes() == OBJECTS["ds/big.bin"]


def test_a_corrupt_partial_file_is_caught_by_the_etag_removed_and_fetched_whole_next_time(s3):
    etag = s3.client.head_object(Bucket="data", Key="ds/big.bin")["ETag"].strip('"')
    part = s3.home("node-2") / "ds" / partial_name("big.bin", etag)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * MiB)
    first = s3.run(selection="node-2").nodes[0]
    assert first.status == "failed" and first.errors == [first.errors[0]]
    assert first.errors[0].startswith("big.bin: content differs from the bucket's ETag")
    assert not part.exists() and not (s3.home("node-2") / "ds" / "big.bin").exists()
    second = s3.run(selection="node-2").nodes[0]
    assert second.status == "ok" and second.downloaded == 1
    assert (s3.home("node-2") / "ds" / "big.bin").read_bytes() == OBJECTS["ds/big.bin"]


def test_urls_that_expire_mid_run_are_renewed_and_the_nodes_go_on(s3):
    """Real expiry (the proxy checks X-Amz-Date + X-Amz-Expires as S3 does): URLs live 4 s, each
    object takes ~1 s through a 1 MiB/s link, one at a time, so later URLs expire before use."""
    for i in range(8):
        s3.client.put_object(Bucket="data", Key=f"slow/{i}.bin", Body=bytes([i]) * MiB)
    s3.proxy.rules.rate = MiB
    result = s3.run("s3://data/slow", "slow", selection="node-[1-2]", threads=1, url_expiry=4)
    assert result.exit_code == 0, [n.error for n in result.nodes]
    assert all(n.renewals >= 1 and n.downloaded == 8 and n.verified == 8 for n in result.nodes)
    assert any(status == 403 for _, _, status in s3.proxy.rules.gets)
    for n in result.nodes:
        assert _tree(s3.home(n.node) / "slow") == {f"{i}.bin": bytes([i]) * MiB for i in range(8)}


def test_a_url_rejected_again_right_after_its_renewal_fails_that_object_only(s3):
    s3.proxy.rules.always_expired.add("ds/a.bin")  # a clock that disagrees with the signer's
    node = s3.run(selection="node-3").nodes[0]
    assert node.status == "failed" and node.renewals == 1 and node.downloaded == 5
    assert node.errors == ["a.bin: presigned URL rejected as expired again right after its renewal "
                           "(is the control machine's clock right?)"]
    statuses = [s for _, k, s in s3.proxy.rules.gets if k == "ds/a.bin"]
    assert statuses == [403, 403]  # renewed once, not in a loop


def test_denied_deleted_and_archived_objects_are_one_line_each_while_the_rest_lands(s3):
    s3.client.put_object(Bucket="data", Key="ds/cold.bin", Body=b"c", StorageClass="GLACIER")
    s3.proxy.rules.denied.add("ds/a.bin")
    s3.proxy.rules.delete_on_get.add("ds/big.bin")
    result = s3.run()
    assert result.exit_code == 1
    for n in result.nodes:
        assert n.status == "failed" and n.downloaded == 4
        assert sorted(n.errors) == [
            "a.bin: denied (403 AccessDenied: Access Denied)",
            "big.bin: gone since the listing (404 NoSuchKey)",
            "cold.bin: archived (403 InvalidObjectState): restore it from Glacier first"]
        assert n.error.startswith("3 object(s) failed: ")
        assert set(_tree(s3.home(n.node) / "ds")) == {"sub/b t ü.txt", "empty", "multi.bin", "kms.bin"}


def test_recheck_finds_a_file_changed_on_a_node_and_fetches_it_again(s3):
    assert s3.run().exit_code == 0
    target = s3.home("node-2") / "ds" / "multi.bin"
    stat = target.stat()
    data = bytearray(target.read_bytes())
    data[6 * MiB] ^= 0xFF  # same size, same mtime: only a hash can tell
    target.write_bytes(bytes(data))
    os.utime(target, (stat.st_atime, stat.st_mtime))
    assert [n.downloaded for n in s3.run().nodes] == [0, 0, 0]
    result = s3.run(recheck=True)
    assert [(n.downloaded, n.rechecked) for n in result.nodes] == [(0, 5), (1, 5), (0, 5)]
    assert target.read_bytes() == b"".join(PARTS)


def test_a_changed_object_is_downloaded_again_and_only_it(s3):
    assert s3.run(selection="node-1").exit_code == 0
    time.sleep(1.1)  # LastModified has one-second resolution
    s3.client.put_object(Bucket="data", Key="ds/a.bin", Body=b"new and longer content")
    node = s3.run(selection="node-1").nodes[0]
    assert (node.status, node.downloaded, node.up_to_date) == ("ok", 1, 5)
    assert (s3.home("node-1") / "ds" / "a.bin").read_bytes() == b"new and longer content"


def test_one_object_url_lands_in_dest_and_unsafe_keys_are_refused(s3):
    node = s3.run("s3://data/ds/a.bin", "one", selection="node-1").nodes[0]
    assert node.status == "ok" and _tree(s3.home("node-1") / "one") == {"a.bin": b"a" * 5000}
    s3.client.put_object(Bucket="data", Key="ds/../escape", Body=b"x")
    result = s3.run(selection="node-1")
    assert result.skipped_keys == ["ds/../escape"] and result.exit_code == 1
    assert not (s3.home("node-1") / "escape").exists()


def test_missing_bucket_empty_prefix_and_no_credentials_fail_before_any_node_runs(s3, monkeypatch):
    with pytest.raises(ToolError, match="s3://nope: no such bucket"):
        s3.run("s3://nope/ds")
    with pytest.raises(ToolError, match=r"s3://data/dz: no objects under this prefix") as empty:
        s3.run("s3://data/dz")
    assert "ds/" in empty.value.hint
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ToolError, match="no AWS credentials on this machine") as nocreds:
        s3.run()
    assert "nodes need none" in nocreds.value.hint
    assert s3.fake.calls == []


def test_multipart_digest_is_s3s_etag():
    from clustertool.nodeprogs.s3lib import Digest

    d = Digest(5 * MiB)
    for block in (PARTS[0][:100], PARTS[0][100:] + PARTS[1][:7], PARTS[1][7:], PARTS[2]):
        d.update(block)
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in PARTS)).hexdigest() + "-3"
    assert d.etag() == want
