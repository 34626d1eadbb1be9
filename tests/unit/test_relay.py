"""The copy relay's stream, verified as it is written (nodeprogs/stream.py, extract.py, relay.py).

Pure parts (the format, the parser, the writer) run in-process; the whole node program runs
as real processes (source -> hop -> hop, each in its own "home", the dialer handing the next
link over a unix socket) with ``sh`` in place of ssh.  The real relay over sshd runs in
tests/local/test_copy.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from clustertool.nodeprogs import extract, link, program_text, stream
from clustertool.transfer import chain, manifest, plan

pytestmark = pytest.mark.unit

ODD = "odd name 'q' \"dq\" ü\tx"


def make_tree(root):
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty dir").mkdir()
    (root / ODD).mkdir()
    (root / "a.txt").write_text("hello\n")
    os.chmod(root / "a.txt", 0o640)
    (root / "link-to-a").symlink_to("a.txt")
    (root / ODD / "small").write_bytes(b"x" * 100)
    (root / "zero").write_bytes(b"")
    for i in range(3):
        (root / "sub" / "deeper" / f"blob {i}").write_bytes(os.urandom(300_000 + i))
    os.chmod(root / "sub", 0o700)
    os.utime(root / "a.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return sorted(manifest.local(str(root)).entries)


def packed(root, names, algo="sha256"):
    buf = io.BytesIO()
    status = stream.pack(str(root), names, algo, buf.write)
    return buf.getvalue(), status


def unpack(data, dest, chunk=65536):
    tally = extract.Tally()
    sink = extract.Extractor(str(dest), tally)
    parser = stream.Unpacker(sink)
    for i in range(0, len(data), chunk):
        parser.feed(data[i:i + chunk])
    parser.finish()
    sink.finish()
    return tally


def same_tree(a, b):
    return manifest.compare(manifest.local(str(a), True), manifest.local(str(b), True), extras=True)


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 22])
def test_a_tree_arrives_whole_and_every_file_is_verified_as_written_whatever_the_chunking(tmp_path, chunk):
    names = make_tree(tmp_path / "src")
    data, sent = packed(tmp_path / "src", names)
    if chunk == 1:
        data_small = packed(tmp_path / "src", ["a.txt", ODD, f"{ODD}/small", "link-to-a"])[0]
        tally = unpack(data_small, tmp_path / "one", chunk=1)
        assert tally.verified == 2 and (tmp_path / "one" / ODD / "small").read_bytes() == b"x" * 100
        return
    tally = unpack(data, tmp_path / "dst", chunk=chunk)
    assert sent["files"] == 6 and sent["errors"] == []
    assert (tally.files, tally.verified, tally.bad, tally.errors) == (6, 6, [], [])
    assert same_tree(tmp_path / "src", tmp_path / "dst") == []
    assert os.readlink(tmp_path / "dst" / "link-to-a") == "a.txt"
    assert os.stat(tmp_path / "dst" / "a.txt").st_mtime_ns == 1_600_000_000_123_456_789
    assert oct(os.stat(tmp_path / "dst" / "sub").st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("algo", ["sha256", "blake2b-128", "sha1"])
def test_the_hash_is_the_one_named_and_source_and_hop_agree(tmp_path, algo):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "f").write_bytes(b"abc" * 1000)
    data, _ = packed(tmp_path / "s", ["f"], algo)
    trailer = json.loads(data[data.rindex(b'{"h"'):].split(b"\n")[0])
    h = stream.new_hash(algo)
    h.update(b"abc" * 1000)
    assert trailer["h"] == h.hexdigest()
    assert unpack(data, tmp_path / "d").verified == 1


def test_a_byte_changed_in_transit_is_named_and_the_rest_still_verifies(tmp_path):
    names = make_tree(tmp_path / "src")
    data, _ = packed(tmp_path / "src", names)
    at = data.index(b'"p":"sub/deeper/blob 1"')
    at = data.index(b"\n", at) + 1000  # inside that file's data
    bad = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    tally = unpack(bad, tmp_path / "dst")
    assert tally.bad == [["content differs (written bytes do not hash as sent)", "sub/deeper/blob 1"]]
    assert (tally.files, tally.verified, tally.errors) == (6, 5, [])
    # the bad file must not look current to the next copy's quick check (size and whole-second
    # mtime), even when the source file was written in the same second as the copy
    src_m = os.stat(tmp_path / "src" / "sub/deeper/blob 1").st_mtime
    assert int(os.stat(tmp_path / "dst" / "sub/deeper/blob 1").st_mtime) != int(src_m)
    again = plan.plan_node("n", manifest.local(str(tmp_path / "src")), manifest.local(str(tmp_path / "dst")))
    assert again.hash_check == ["sub/deeper/blob 1"] and again.send == [], again


def test_without_verification_nothing_is_hashed_but_everything_is_written(tmp_path):
    names = make_tree(tmp_path / "src")
    data, _ = packed(tmp_path / "src", names, algo=None)
    trailers = []

    class Recorder(extract.Skipper):
        def end_file(self, handle, trailer):
            trailers.append(trailer)

    stream.Unpacker(Recorder()).feed(data)
    assert trailers == [{}] * 6
    tally = unpack(data, tmp_path / "dst")
    assert (tally.files, tally.verified, tally.bad) == (6, 0, [])
    assert same_tree(tmp_path / "src", tmp_path / "dst") == []


def test_a_stream_cut_anywhere_is_told_from_a_whole_one(tmp_path):
    names = make_tree(tmp_path / "src")
    data, _ = packed(tmp_path / "src", names)
    end = data.rindex(b'{"end"')
    boundary = data.rindex(b"\n", 0, end - 1) + 1  # cut right after the last entry: a clean line break
    for cut in (0, 5, len(data) // 2, boundary, end, len(data) - 1):
        parser = stream.Unpacker(extract.Skipper())
        parser.feed(data[:cut])
        with pytest.raises(stream.StreamError, match="unexpected end of stream"):
            parser.finish()


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", ""])
def test_paths_that_leave_dest_are_refused(tmp_path, path):
    data = stream.MAGIC + stream.line({"algo": None}) + stream.line({"p": path, "t": "d", "m": 0, "x": 0o755})
    with pytest.raises(stream.StreamError, match="unsafe path"):
        stream.Unpacker(extract.Skipper()).feed(data)


def test_garbage_is_not_a_stream(tmp_path):
    with pytest.raises(stream.StreamError, match="not a clustertool copy stream"):
        stream.Unpacker(extract.Skipper()).feed(b"ustar garbage\n")


def test_a_file_that_shrinks_while_sent_keeps_the_stream_in_step_and_is_named(tmp_path):
    names = make_tree(tmp_path / "src")
    shrink = tmp_path / "src" / "sub" / "deeper" / "blob 0"
    real_send = stream._send_file

    def shrinking(fd, size, algo, write):  # the file loses its tail between stat and read
        os.truncate(shrink, 1000) if os.fstat(fd).st_size == 300_000 else None
        return real_send(fd, size, algo, write)

    stream._send_file = shrinking
    try:
        data, sent = packed(tmp_path / "src", names)
    finally:
        stream._send_file = real_send
    assert sent["errors"] == ["sub/deeper/blob 0: file shrank while being read"]
    tally = unpack(data, tmp_path / "dst")
    assert tally.bad == [["changed at the source while being sent (file shrank while being read)",
                          "sub/deeper/blob 0"]]
    assert tally.verified == 5  # the files after it still line up


def test_the_writer_replaces_files_and_links_but_never_a_directory(tmp_path):
    (tmp_path / "s" / "x").mkdir(parents=True)
    (tmp_path / "s" / "f").write_text("new")
    (tmp_path / "s" / "l").symlink_to("f")
    (tmp_path / "s" / "x" / "y").write_text("y")
    dst = tmp_path / "d"
    (dst / "f").mkdir(parents=True)           # a directory where a file comes: an error, not a wipe
    (dst / "f" / "keep").write_text("keep")
    (dst / "l").write_text("a file where a link comes")
    (dst / "x").mkdir()
    (dst / "x" / "y").symlink_to("/etc/passwd")  # a link where a file comes: replaced, not followed
    data, _ = packed(tmp_path / "s", ["f", "l", "x", "x/y"])
    tally = unpack(data, dst)
    assert (dst / "f" / "keep").read_text() == "keep"
    assert tally.bad == [["not written", "f"]] and "Is a directory" in tally.errors[0]
    assert os.readlink(dst / "l") == "f" and (dst / "x" / "y").read_text() == "y"
    assert not (dst / "x" / "y").is_symlink()


def test_fastest_hash_is_one_of_the_candidates_every_python_has():
    assert stream.fastest_hash() in stream.HASH_CANDIDATES
    for algo in stream.HASH_CANDIDATES:
        assert stream.new_hash(algo).hexdigest()


def test_the_hash_is_decided_by_the_cpu_so_every_run_names_the_same_one():
    assert {stream.fastest_hash() for _ in range(5)} == {stream.fastest_hash()}  # it was timed: either, by load
    assert stream.fastest_hash("flags\t\t: fpu sse2 sha_ni avx2\n", "x86_64") == "sha256"
    assert stream.fastest_hash("Features\t: fp asimd aes sha1 sha2\n", "aarch64") == "sha256"
    assert stream.fastest_hash("flags\t\t: fpu sse2 avx2\n", "x86_64") == "blake2b-128"
    assert stream.fastest_hash("", "arm64") == "sha256" and stream.fastest_hash("", "x86_64") == "blake2b-128"


# ---- the whole program, as processes ---------------------------------------------------------

def _python_at(home, sdir):
    """What ssh to a node would run (relay_command), with sh in a home folder instead."""
    return ["sh", "-c", f'cd "{home}" && exec "{sys.executable}" {sdir}/relay.py']


def _prepare(home, stations):
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-"], input=chain.prepare_program(stations), cwd=home, check=True, timeout=30)


def _chain(tmp_path, names, *, blocked=False, dead_third=False, on_progress=None):
    """source (here) -> node-2 (dials node-3 ahead) -> node-3; returns (source run, homes)."""
    h2, h3 = tmp_path / "node-2", tmp_path / "node-3"
    s2, s3 = chain.status_dir("r1", "node-2"), chain.status_dir("r1", "node-3")
    args2 = chain.hop_args("node-2", s2, "blocked/d" if blocked else "data", True, ("x", s3), None)
    args2["forward"] = ["sh", "-c", "exit 255"] if dead_third else _python_at(h3, s3)
    _prepare(h3, [chain.hop_station(chain.hop_args("node-3", s3, "data", True, None, None))])
    if blocked:
        h2.mkdir()
        (h2 / "blocked").write_text("a file, not a folder")
    _prepare(h2, [chain.hop_station(args2)])
    src = chain.source_args(str(tmp_path / "src"), names, "sha256", forward=_python_at(h2, s2))
    run = chain.stream([sys.executable, "-"], program_text("relay", src), timeout=60, on_progress=on_progress)
    for home, sdir in ((h2, s2), (h3, s3)):
        assert not (home / sdir).exists() or sdir == s3 and dead_third  # a relay removes its folder when done
    return run, {node: run.done.get(node) for node in ("node-2", "node-3")}


def test_the_relay_writes_and_forwards_at_once_and_every_hop_verifies(tmp_path):
    names = make_tree(tmp_path / "src")
    run, st = _chain(tmp_path, names)
    assert run.returncode == 0, run.stderr
    assert run.source["files"] == 6 and run.source["next_rc"] == 0
    for node in ("node-2", "node-3"):
        assert same_tree(tmp_path / "src", tmp_path / node / "data") == [], node
        assert (st[node]["rc"], st[node]["files"], st[node]["verified"], st[node]["bad"]) == (0, 6, 6, [])
    assert st["node-2"]["next_rc"] == 0 and st["node-3"]["next_rc"] is None
    assert not run.other_lines  # progress lines were parsed, nothing else was said


def test_progress_of_every_hop_comes_back_to_the_head(tmp_path):
    names = make_tree(tmp_path / "src")
    got = []
    run, _ = _chain(tmp_path, names, on_progress=lambda node, done: got.append((node, done)))
    total = run.source["bytes"]
    assert run.returncode == 0 and total == 900_109
    assert ("node-2", total) in got and ("node-3", total) in got


def test_a_hop_that_cannot_write_dest_still_forwards_everything(tmp_path):
    names = make_tree(tmp_path / "src")
    run, st = _chain(tmp_path, names, blocked=True)
    assert st["node-2"]["rc"] == 2 and "cannot create DEST 'blocked/d'" in st["node-2"]["err"]
    assert same_tree(tmp_path / "src", tmp_path / "node-3" / "data") == []
    assert st["node-3"]["verified"] == 6


def test_a_hop_whose_next_hop_is_gone_still_writes_its_own_copy(tmp_path):
    names = make_tree(tmp_path / "src")
    run, st = _chain(tmp_path, names, dead_third=True)
    assert st["node-2"]["rc"] == 0 and st["node-2"]["verified"] == 6 and st["node-2"]["next_rc"] == 255
    assert same_tree(tmp_path / "src", tmp_path / "node-2" / "data") == []
    assert st["node-3"] is None or st["node-3"]["rc"] != 0


def test_stations_left_running_are_stopped_and_removed_by_the_next_listing(tmp_path):
    """A chain prepared ahead but not used: its relay and dialer stop, its folder goes."""
    sdir = tmp_path / chain.status_dir("r9", "node-2", 0)
    sdir.mkdir(parents=True)
    relay = subprocess.Popen(["sleep", "30"], start_new_session=True)
    dialer = subprocess.Popen(["sleep", "30"], start_new_session=True)
    (sdir / "pgid").write_text(f"{relay.pid}\n")
    (sdir / "pgid.dial").write_text(f"{dialer.pid}\n")
    (tmp_path / "data").mkdir()
    proc = subprocess.run([sys.executable, "-"], cwd=tmp_path, capture_output=True, check=True,
                          input=manifest.remote_args("data", cleanup=[chain.status_dir("r9", "node-2", 0)]))
    out = proc.stdout.decode()
    assert json.loads(out.splitlines()[0])["cleaned"] == 1
    assert relay.wait(timeout=5) != 0 and dialer.wait(timeout=5) != 0 and not sdir.exists()


def test_a_survey_prepares_the_stations_and_lists_dest(tmp_path, monkeypatch):
    """The copy's first round on a node: its hop station stored, its dialer forked, DEST listed."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "old").write_text("x")
    sdir = chain.status_dir("r8", "node-2", 0)
    station = chain.hop_station(chain.hop_args("node-2", sdir, "data", True, ("x", "next"), None))
    station["forward"] = ["sh", "-c", "cat > got"]
    out = subprocess.run([sys.executable, "-"], cwd=tmp_path, capture_output=True, check=True, timeout=30,
                         input=manifest.remote_args("data", program="survey", prepare=[station])).stdout.decode()
    assert [e["p"] for e in manifest.parse(out).entries.values()] == ["old"]
    assert "def run_hop(" in (tmp_path / sdir / "relay.py").read_text()
    monkeypatch.chdir(tmp_path)  # a node's home, where its stations live (a unix socket path is short)
    fwd = link.connect_forward(sdir)  # what the hop's relay does when it starts
    link.write_all(fwd.fd, b"through the link opened ahead")
    assert fwd.wait() == 0 and (tmp_path / "got").read_bytes() == b"through the link opened ahead"


def test_done_lines_parse():
    assert chain.parse_done('CTDONE node-4 {"rc": 0, "files": 2}') == ("node-4", {"rc": 0, "files": 2})
    assert chain.parse_done("CTDONE node-4 {cut") is None
    st = chain.hop_status("node-4", {"rc": 2, "err": "x: No space left on device", "next_error": "next hop: gone"})
    assert not st.extracted_ok and "No space" in st.stderr and "next hop: gone" in st.stderr
    assert chain.hop_status("node-5", None).rc == "missing"


def test_progress_lines_parse():
    assert chain.parse_progress("CTPROG node-3 8388608") == ("node-3", 8388608)
    assert chain.parse_progress("ssh: connect to host x port 22: Connection refused") is None
