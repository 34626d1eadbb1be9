"""Command builders of the relay and the fan-out (pure), and their parsers."""

import os
import shlex
import subprocess

import pytest

from clustertool.errors import UsageError
from clustertool.nodeprogs import shell_script
from clustertool.transfer import chain, fanout
from clustertool.transfer import copy as copies
from clustertool.transfer.model import relative_remote

pytestmark = pytest.mark.unit

NASTY = "/data/my set 'v2' \"q\" ü; rm -rf /"


def test_hop_script_quotes_dest_and_is_valid_bash():
    script = chain.hop_script(NASTY, ".cache/clustertool/copy-x-node-2", "node-2", True,
                              ("10.213.0.3", ".cache/clustertool/copy-x-node-3"), "aes128-gcm@openssh.com")
    assert shlex.quote(NASTY) in script and "tee -p >(extract)" in script
    assert "-c aes128-gcm@openssh.com 10.213.0.3" in script
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0


def _tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.bin").write_bytes(b"x" * 5000)
    (root / "top.txt").write_text("top\n")
    return ["sub", "sub/f.bin", "top.txt"]


def _stream(src, names) -> bytes:
    """The tar stream a chain carries (what tar_create_argv makes of these names)."""
    return subprocess.run(chain.tar_create_argv(str(src)), input=b"".join(n.encode() + b"\0" for n in names),
                          capture_output=True, check=True).stdout


def _hop(home, script: str, data: bytes) -> subprocess.CompletedProcess:
    """Run a hop as the relay does: the script stored in its status folder, the stream on stdin."""
    sdir = home / "st"
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / "hop.sh").write_text(script)
    return subprocess.run(["bash", str(sdir / "hop.sh")], input=data, capture_output=True, cwd=home,
                          env=dict(os.environ, HOME=str(home)), timeout=30)


def test_the_last_hop_extracts_into_dest_and_records_its_exit_code(tmp_path):
    data = _stream(tmp_path / "src", _tree(tmp_path / "src"))
    home = tmp_path / "home"
    _hop(home, chain.hop_script("my data", "st", "node-4", True, None, None), data)
    assert (home / "my data" / "sub" / "f.bin").read_bytes() == b"x" * 5000
    assert (home / "st" / "rc").read_text().strip() == "0" and (home / "st" / "pgid").read_text().strip()
    assert not (home / "st" / "next_rc").exists()


def test_a_hop_extracts_and_forwards_the_same_stream_at_once(tmp_path):
    data = _stream(tmp_path / "src", _tree(tmp_path / "src"))
    home = tmp_path / "home"
    _hop(home, shell_script("hop", SDIR="st", DEST="d", EXTRACT=1, TAR_EXTRACT=chain.tar_extract_argv("node-2"),
                            FORWARD=["sh", "-c", "cat > next.tar"]), data)
    assert (home / "next.tar").read_bytes() == data and (home / "d" / "top.txt").read_text() == "top\n"
    assert [(home / "st" / f).read_text().strip() for f in ("rc", "next_rc")] == ["0", "0"]


def test_a_relay_only_hop_forwards_without_extracting(tmp_path):
    data = _stream(tmp_path / "src", _tree(tmp_path / "src"))
    home = tmp_path / "home"
    _hop(home, shell_script("hop", SDIR="st", DEST="d", EXTRACT=0, TAR_EXTRACT=chain.tar_extract_argv("node-1"),
                            FORWARD=["sh", "-c", "cat > next.tar"]), data)
    assert (home / "next.tar").read_bytes() == data and not (home / "d").exists()
    assert (home / "st" / "rc").read_text().strip() == "0"


def test_a_hop_that_cannot_write_dest_still_forwards_everything(tmp_path):
    data = _stream(tmp_path / "src", _tree(tmp_path / "src"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "blocked").write_text("a file, not a folder")
    _hop(home, shell_script("hop", SDIR="st", DEST="blocked/d", EXTRACT=1, TAR_EXTRACT=chain.tar_extract_argv("n"),
                            FORWARD=["sh", "-c", "cat > next.tar"]), data)
    assert (home / "next.tar").read_bytes() == data
    assert (home / "st" / "rc").read_text().strip() == "2" and "blocked" in (home / "st" / "err").read_text()


def test_source_command_streams_names_from_stdin_to_first_hop():
    cmd = chain.leader_source_command("/src dir", ("10.213.0.2", "s"), "chacha20-poly1305@openssh.com")
    tar, _, ssh = cmd.partition(" | ")
    assert shlex.split(tar) == chain.tar_create_argv("/src dir")
    assert "--null" in tar and "--verbatim-files-from" in tar and "--no-recursion" in tar
    assert shlex.split(ssh)[-2:] == ["10.213.0.2", "bash s/hop.sh"]


def test_tar_pipeline_keeps_names_links_and_empty_dirs(tmp_path):
    src, dst = tmp_path / "s", tmp_path / "d"
    (src / "e mpty").mkdir(parents=True)
    (src / NASTY.replace("/", "_")).write_text("x")
    (src / "l").symlink_to("e mpty")
    names = sorted(p.name for p in src.iterdir())
    dst.mkdir()
    create = subprocess.Popen(chain.tar_create_argv(str(src)), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    extract = subprocess.Popen(["bash", "-c", "exec 3>/dev/null; " + shlex.join(chain.tar_extract_argv("n"))],
                               stdin=create.stdout, cwd=dst)
    create.stdin.write(b"".join(n.encode() + b"\0" for n in names))
    create.stdin.close()
    assert extract.wait() == 0 and create.wait() == 0
    assert (dst / "l").is_symlink() and (dst / "e mpty").is_dir()
    assert (dst / NASTY.replace("/", "_")).read_text() == "x"


def test_status_and_progress_parsing():
    st = chain.parse_status("node-3", "rc=2\nnext_rc=0\ntar: x: Cannot write: No space left on device\n")
    assert (st.rc, st.next_rc, st.extracted_ok) == ("2", "0", False)
    assert "No space" in st.stderr
    assert chain.parse_progress("CTPROG node-3 10") == ("node-3", 10 * chain.RECORD_BYTES)
    assert chain.parse_progress("tar: something") is None


def test_truncated_stream_is_told_from_a_write_failure():
    from clustertool.transfer.drive import truncated, write_error

    assert truncated(chain.HopStatus("n", rc="2", stderr="tar: Unexpected EOF in archive"))
    assert truncated(chain.HopStatus("n", rc="missing"))
    full = chain.HopStatus("n", rc="2", stderr="tar: f: Cannot write: No space left on device")
    assert not truncated(full) and write_error(full).startswith("disk full")


def test_rsync_argv_keeps_links_perms_times_and_protects_args():
    argv = fanout.rsync_argv("/src", True, "10.213.0.2", NASTY, cipher="aes128-gcm@openssh.com", delete=True)
    assert argv[:4] == ["rsync", "-a", "-s", "--mkpath"] and "--delete" in argv
    assert argv[-2:] == ["/src/", f"10.213.0.2:{NASTY.rstrip('/')}/"]
    assert "-c aes128-gcm@openssh.com" in argv[argv.index("-e") + 1]
    assert fanout.rsync_argv("/f.bin", False, "h", "d")[-2:] == ["/f.bin", "h:d/"]
    assert fanout.parse_file_line("CTFILE >f+++++++++ 123") == 123
    assert fanout.parse_file_line("CTFILE cd+++++++++ 4096") is None


def test_remote_paths_and_strategy_choice():
    assert relative_remote("~/data") == "data" and relative_remote("~") == "."
    assert relative_remote("/abs") == "/abs"
    with pytest.raises(UsageError):
        relative_remote("~bob/x")
    assert copies.choose_strategy("auto", 8, 1 << 30) == "chain"
    assert copies.choose_strategy("auto", 2, 1 << 30) == "fanout"
    assert copies.choose_strategy("auto", 8, 1000) == "fanout"
    with pytest.raises(UsageError):
        copies.choose_strategy("bogus", 1, 1)


def test_abort_stops_only_this_runs_process_groups_and_is_valid_bash():
    cmd = chain.abort_command("abc123")
    assert ".cache/clustertool/copy-abc123-*" in cmd and "kill -TERM -- -" in cmd
    assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0
    src = chain.leader_source_command("/s", ("10.0.0.2", "h"), None, ".cache/clustertool/copy-abc123-source")
    assert src.startswith("mkdir -p .cache/clustertool/copy-abc123-source && ps -o pgid= $$")
    assert subprocess.run(["bash", "-n", "-c", src]).returncode == 0
    hop = chain.hop_script("d", "s", "n", True, None, None)
    assert "ps -o pgid= $$" in hop


def test_abort_command_kills_a_recorded_process_group(tmp_path):
    home = tmp_path
    sdir = home / ".cache/clustertool/copy-run1-node-2"
    sdir.mkdir(parents=True)
    proc = subprocess.Popen(["bash", "-c", "sleep 30 | cat"], start_new_session=True)
    (sdir / "pgid").write_text(str(proc.pid))
    subprocess.run(["bash", "-c", chain.abort_command("run1")], cwd=home, check=True)
    assert proc.wait(timeout=5) != 0 and not sdir.exists()


def test_fanout_jobs_record_their_process_group_for_abort():
    cmd = fanout.tracked("rsync -a a b", ".cache/clustertool/copy-r-fanout-node-2")
    assert cmd.startswith("mkdir -p .cache/clustertool/copy-r-fanout-node-2 && ps -o pgid= $$")
    assert "rsync -a a b; rc=$?" in cmd and subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0
