"""The node-side S3 program with both clients (boto3 and the stdlib one) against moto over HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from clustertool.nodeprogs import s3 as prog

pytestmark = pytest.mark.aws

CREDS = {"key": "testing", "secret": "testing", "token": None}


@pytest.fixture(scope="module")
def moto_endpoint():
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "moto server did not start"
                time.sleep(0.2)
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="clients")
        for i in range(1205 // 100):
            client.put_object(Bucket="clients", Key=f"p/{i:03d} sp ü+&=.bin", Body=bytes([i]) * (i + 1))
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("client_cls", [prog.StdlibS3, prog.Boto3S3])
def test_both_clients_list_and_download_the_same_objects(moto_endpoint, tmp_path, client_cls, monkeypatch):
    args = {"bucket": "clients", "prefix": "p/", "dest": str(tmp_path), "endpoint": moto_endpoint,
            "region": "us-east-1", "creds": CREDS}
    client = client_cls(args)
    listing = client.list("clients", "p/")
    assert len(listing) == 12 and all(len(o["etag"]) == 32 for o in listing)
    monkeypatch.setattr(prog, "make_client", lambda a: client)  # it picks boto3 when importable
    first = prog.sync(args)
    again = prog.sync(args)
    assert (first["objects"], first["downloaded"], first["verified"], first["errors"]) == (12, 12, 12, [])
    assert again["downloaded"] == 0 and again["verified"] == 12
    assert (tmp_path / "011 sp ü+&=.bin").read_bytes() == bytes([11]) * 12


def test_stdlib_client_reports_s3_error_codes(moto_endpoint):
    client = prog.StdlibS3({"endpoint": moto_endpoint, "creds": CREDS})
    with pytest.raises(RuntimeError, match="NoSuchBucket"):
        client.list("absent-bucket", "")
