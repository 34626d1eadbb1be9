"""Command builders of the relay and the fan-out (pure), and their parsers."""

import subprocess

import pytest

from clustertool.core.errors import UsageError
from clustertool.transfer import chain, copy, fanout
from clustertool.transfer.results import relative_remote

pytestmark = pytest.mark.unit

NASTY = "/data/my set 'v2' \"q\" ü; rm -rf /"


def test_rsync_argv_keeps_links_perms_times_and_protects_args():
    argv = fanout.rsync_argv("/src", True, "10.213.0.2", NASTY, cipher="aes128-gcm@openssh.com", delete=True)
    assert argv[:4] == ["rsync", "-a", "-s", "--mkpath"] and "--delete" in argv
    assert argv[-2:] == ["/src/", f"10.213.0.2:{NASTY.rstrip('/')}/"]
    assert "-c aes128-gcm@openssh.com" in argv[argv.index("-e") + 1]
    assert fanout.rsync_argv("/f.bin", False, "h", "d")[-2:] == ["/f.bin", "h:d/"]
    assert "--out-format=CTFILE %i %l %n" in argv
    assert fanout.parse_file_line("CTFILE >f+++++++++ 123 sub/a b.bin") == (123, "sub/a b.bin")
    assert fanout.parse_file_line("CTFILE cd+++++++++ 4096 sub") is None


def test_rsync_names_with_escaped_bytes_come_back_as_the_files_own_names():
    # rsync writes unprintable bytes as backslash-#-octal (a C locale on the leader: even UTF-8)
    assert fanout.parse_file_line("CTFILE >f.st...... 5 odd \\#303\\#274/x") == (5, "odd ü/x")
    assert fanout.unescape_name("tab\\#011here") == "tab\there"
    assert fanout.unescape_name("plain #1 \\n") == "plain #1 \\n"


def test_remote_paths_and_strategy_choice():
    assert relative_remote("~/data") == "data" and relative_remote("~") == "."
    assert relative_remote("/abs") == "/abs"
    with pytest.raises(UsageError):
        relative_remote("~bob/x")
    assert copy.choose_strategy("auto", 8, 1 << 30) == "chain"
    assert copy.choose_strategy("auto", 2, 1 << 30) == "fanout"
    assert copy.choose_strategy("auto", 8, 1000) == "fanout"
    with pytest.raises(UsageError):
        copy.choose_strategy("bogus", 1, 1)


def test_abort_stops_only_this_runs_process_groups_and_is_valid_bash():
    cmd = chain.abort_command("abc123")
    assert ".cache/clustertool/copy-abc123-*/pgid*" in cmd and "kill -TERM -- -" in cmd
    assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0
    assert chain.status_dir("abc123", "node-2", 2).startswith(".cache/clustertool/copy-abc123-")


def test_abort_command_kills_the_relay_and_the_dialer_of_a_run(tmp_path):
    home = tmp_path
    sdir = home / chain.status_dir("run1", "node-2")
    sdir.mkdir(parents=True)
    relay = subprocess.Popen(["bash", "-c", "sleep 30 | cat"], start_new_session=True)
    dialer = subprocess.Popen(["sleep", "30"], start_new_session=True)
    (sdir / "pgid").write_text(str(relay.pid))
    (sdir / "pgid.dial").write_text(str(dialer.pid))
    other = home / chain.status_dir("run2", "node-2")
    other.mkdir(parents=True)
    subprocess.run(["bash", "-c", chain.abort_command("run1")], cwd=home, check=True)
    assert relay.wait(timeout=5) != 0 and dialer.wait(timeout=5) != 0
    assert not sdir.exists() and other.exists()


def test_fanout_jobs_record_their_process_group_for_abort():
    cmd = fanout.tracked("rsync -a a b", ".cache/clustertool/copy-r-fanout-node-2")
    assert cmd.startswith("mkdir -p .cache/clustertool/copy-r-fanout-node-2 && ps -o pgid= $$")
    assert "rsync -a a b; rc=$?" in cmd and subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0
