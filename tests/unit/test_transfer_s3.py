"""sync-s3's pure parts: URL and duration parsing, where keys land, shards, how objects are verified,
what a node is sent (never a credential), the node-side session scripting, and that the node
programs carry no request-signing code any more."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from clustertool.core.errors import UsageError
from clustertool.nodeprogs import DIR, program_stream, stream_command
from clustertool.transfer import s3
from clustertool.transfer.s3bucket import (
    SIZE_ONLY,
    S3Object,
    folder_prefix,
    local_name,
    parse_duration,
    parse_url,
    part_check,
    shard_of,
)

pytestmark = pytest.mark.unit


def test_s3_urls_and_folder_prefixes():
    assert parse_url("s3://b/p/q") == ("b", "p/q") and parse_url("s3://b") == ("b", "")
    for bad in ("b/p", "s3:///p", "https://b/p"):
        with pytest.raises(UsageError):
            parse_url(bad)
    assert [folder_prefix(p) for p in ("", "ds", "ds/", "a/b")] == ["", "ds/", "ds/", "a/b/"]


def test_url_expiry_durations_and_their_bounds():
    assert [parse_duration(t) for t in ("900", "90s", "15m", "2h", "7d", 30)] == [900, 90, 900, 7200, 604800, 30]
    for bad in ("0", "8d", "15 minutes", "-1", ""):
        with pytest.raises(UsageError, match="--url-expiry"):
            parse_duration(bad)


def test_object_keys_map_under_dest_and_unsafe_keys_are_refused():
    assert local_name("ds/a/b.bin", "ds/") == "a/b.bin"
    assert local_name("ds/../../etc/passwd", "ds/") is None
    assert local_name("ds/./x", "ds/") is None
    assert local_name("ds/", "ds/") is None and local_name("ds/dir/", "ds/") is None
    assert local_name("ds//a", "ds/") == "a"


def test_shards_are_disjoint_and_cover_everything():
    objs = [S3Object(f"k{i:03d}", f"k{i:03d}", i, "e", 0) for i in reversed(range(23))]
    shards = [shard_of(objs, i, 4) for i in range(4)]
    keys = [o.key for sh in shards for o in sh]
    assert sorted(keys) == sorted(o.key for o in objs) and len(set(keys)) == 23
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert [o.key for o in shards[1][:2]] == ["k001", "k005"]  # by key order, whatever the listing's


def test_multipart_objects_are_verified_by_parts_only_when_the_parts_can_be_equal():
    mib = 1 << 20
    assert part_check(20 * mib + 5, 3, 8 * mib) == 8 * mib       # 8 + 8 + 4 MiB + 5 B
    assert part_check(16 * mib, 2, 8 * mib) == 8 * mib           # an exact multiple
    assert part_check(30 * mib, 3, 8 * mib) == SIZE_ONLY          # cannot be 3 equal parts of 8 MiB
    assert part_check(8 * mib, 3, 8 * mib) == SIZE_ONLY
    assert part_check(5, None, None) == SIZE_ONLY


def test_a_node_is_sent_its_destination_and_settings_but_no_bucket_endpoint_or_credentials():
    args = s3.node_args("/scratch/ds", 8, 900, False)
    assert args == {"dest": "/scratch/ds", "threads": 8, "expiry": 900, "recheck": False}
    text = program_stream("s3", args, lib=("s3lib",)).decode()
    length, _, program = text.partition("\n")
    assert int(length) == len(program.encode())
    assert "AWS_SECRET_ACCESS_KEY" not in program and "aws_secret_access_key" not in program.lower()


def test_the_node_programs_carry_no_request_signing_code():
    sources = {p.name: p.read_text() for p in DIR.iterdir() if p.suffix in (".py", ".sh")}
    assert "s3.py" in sources and "s3lib.py" in sources
    for name, text in sources.items():
        for marker in ("AWS4-HMAC-SHA256", "import hmac", "X-Amz-Credential", "aws4_request", "Authorization"):
            assert marker not in text, f"{name} contains {marker!r}"


def test_the_stream_command_runs_a_program_and_leaves_it_the_rest_of_stdin(tmp_path):
    """The boot line reads exactly the length-prefixed program; what follows is the program's."""
    (tmp_path / "echo.py").write_text("import sys\nprint(json.dumps({'args': ARGS, 'rest': sys.stdin.read()}))\n")
    from clustertool import nodeprogs

    orig = nodeprogs.DIR
    nodeprogs.DIR = tmp_path
    try:
        payload = program_stream("echo", {"x": 1}) + b"line one\nline two\n"
    finally:
        nodeprogs.DIR = orig
    boot = re.search(r"-c (.*)$", stream_command()).group(1)
    proc = subprocess.run(["sh", "-c", f"{sys.executable} -c {boot}"], input=payload, capture_output=True)
    assert json.loads(proc.stdout) == {"args": {"x": 1}, "rest": "line one\nline two\n"}, proc.stderr
