"""What a failed rsync of a fanout says reaches the node's error, whichever stream carried it."""

from __future__ import annotations

import pytest

from clustertool.transfer.fanout import FILE_MARK, run_parallel

pytestmark = pytest.mark.unit


def test_a_node_rsyncs_message_on_stdout_becomes_the_error_and_file_lines_are_counted():
    # what `rsync ... 2>&1` on the leader prints through ssh: its file lines, then its message
    script = (f"printf '%s\\n' '{FILE_MARK} >f+++++++++ 5 a.txt' "
              "'rsync: [Receiver] mkdir \"/d/x/\" failed: Read-only file system (30)'; exit 11")
    got = run_parallel([("node-2", ["sh", "-c", script])])["node-2"]
    assert got.exit_code == 11 and got.files_sent == 1 and got.bytes_sent == 5
    assert got.error == 'rsync: [Receiver] mkdir "/d/x/" failed: Read-only file system (30)'


def test_messages_on_stderr_still_count_and_a_silent_failure_names_the_exit_code():
    both = run_parallel([("a", ["sh", "-c", "echo 'No space left on device (28)' >&2; exit 23"]),
                         ("b", ["sh", "-c", "exit 12"])])
    assert both["a"].error == "No space left on device (28)"
    assert both["b"].error == "rsync exit 12"
