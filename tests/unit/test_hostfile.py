"""Hostfiles: rendering in four formats, parsing any of them, rejecting garbage by line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustertool.core.errors import SpecError, UsageError
from clustertool.core.hostfile import FORMATS, HostEntry, parse, render, render_cluster, valid_host
from clustertool.core.model import LEADER, ClusterRecord, Node

pytestmark = pytest.mark.unit

ENTRIES = [("10.0.0.1", 8), ("10.0.0.2", 4)]


@pytest.mark.parametrize("fmt, text", [
    ("openmpi", "10.0.0.1 slots=8\n10.0.0.2 slots=4\n"),
    ("mpich", "10.0.0.1:8\n10.0.0.2:4\n"),
    ("horovod", "10.0.0.1:8,10.0.0.2:4\n"),
    ("deepspeed", "10.0.0.1 slots=8\n10.0.0.2 slots=4\n"),
])
def test_render_writes_each_format_with_a_trailing_newline(fmt, text):
    assert render(ENTRIES, fmt) == text


def test_render_of_no_entries_is_empty():
    assert render([], "openmpi") == ""


def test_render_rejects_an_unknown_format_listing_the_known_ones():
    with pytest.raises(UsageError) as info:
        render(ENTRIES, "slurm")
    assert "slurm" in str(info.value) and "openmpi" in info.value.hint


@pytest.mark.parametrize("entry", [("bad host", 1), ("a;b", 1), ("-oProxyCommand=x", 1), ("a", 0), ("a", True)])
def test_render_refuses_entries_that_would_not_parse_back(entry):
    with pytest.raises(UsageError):
        render([entry], "openmpi")


def test_render_cluster_puts_the_leader_first_with_private_addresses_and_slots():
    nodes = [
        Node("node-1", 1, "10.213.0.2", slots=2, ssh_host="54.1.1.1"),
        Node("node-2", 2, "10.213.0.3", role=LEADER, slots=2, ssh_host="54.1.1.2"),
        Node("node-3", 3, "10.213.0.4", slots=2),
    ]
    cluster = ClusterRecord("demo", "local", nodes=nodes)
    assert render_cluster(cluster) == "10.213.0.3 slots=2\n10.213.0.2 slots=2\n10.213.0.4 slots=2\n"
    assert render_cluster(cluster, "horovod") == "10.213.0.3:2,10.213.0.2:2,10.213.0.4:2\n"


def test_parse_accepts_every_format_comments_and_blank_lines():
    text = """
    # leader first
    10.0.0.1 slots=8 max_slots=8   # the leader
    gpu-b.internal slots=4
    node-c

    10.0.0.4:2
    d:1, e:3
    f max-slots=6
    """
    assert parse(text) == [
        HostEntry("10.0.0.1", 8, 8), HostEntry("gpu-b.internal", 4), HostEntry("node-c"),
        HostEntry("10.0.0.4", 2), HostEntry("d", 1), HostEntry("e", 3), HostEntry("f", None, 6),
    ]


def test_parse_accepts_windows_line_ends_and_a_byte_order_mark():
    assert parse("\ufeffa slots=2\r\nb:3\r\n") == [HostEntry("a", 2), HostEntry("b", 3)]


def test_parse_of_an_empty_or_comment_only_file_is_empty():
    assert parse("") == []
    assert parse("# nothing\n\n   \n") == []


@pytest.mark.parametrize("line, fragment", [
    ("10.0.0.1 slots=x", "slots must be a positive integer"),
    ("10.0.0.1 slots=0", "slots must be a positive integer"),
    ("10.0.0.1 slots=-1", "slots must be a positive integer"),
    ("10.0.0.1 gpus=4", "expected slots=N or max_slots=N"),
    ("10.0.0.1 10.0.0.2", "expected slots=N"),
    ("10.0.0.1 slots=2 slots=3", "given twice"),
    ("10.0.0.1 slots=4 max_slots=2", "less than"),
    ("300.0.0.1 slots=2", "not a valid IPv4 address"),
    ("10.0.0 slots=2", "not a valid IPv4 address"),
    ("rm -rf /", "unexpected '-rf' after host rm"),
    ("a;reboot slots=1", "not a valid host name"),
    ("$(id):4", "not a valid host name"),
    ("a:four", "positive integer"),
    ("a:4,,b:4", "empty item"),
    ("a slots=4, b slots=4", "cannot read"),
    ("a\u00e9 slots=1", "not a valid host name"),
])
def test_parse_rejects_garbage_naming_source_line_and_expectation(line, fragment):
    text = "# header\n10.0.0.9 slots=1\n" + line + "\n"
    with pytest.raises(SpecError) as info:
        parse(text, source="hosts.txt")
    message = str(info.value)
    assert message.startswith("hosts.txt:3: ")
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize("host, ok", [
    ("10.0.0.1", True), ("node-1", True), ("ip-10-0-0-1.ec2.internal", True), ("a", True),
    ("1.2.3.256", False), ("a..b", False), ("-a", False), ("a-", False), ("", False), ("a b", False),
    ("x" * 64, False), ("::1", False),
])
def test_valid_host_accepts_ipv4_and_dns_names_only(host, ok):
    assert valid_host(host) is ok


# --- properties ---------------------------------------------------------------------------

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
hostnames = st.lists(label, min_size=1, max_size=3).map(".".join).filter(
    lambda h: not all(p.isdigit() for p in h.split(".")))
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
entries = st.lists(st.tuples(st.one_of(hostnames, ipv4), st.integers(1, 4096)), max_size=20)


@given(entries, st.sampled_from(FORMATS))
@settings(max_examples=300, deadline=None)
def test_parse_of_render_gives_back_the_entries_in_every_format(items, fmt):
    assert [e.as_tuple() for e in parse(render(items, fmt))] == items


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_parse_either_returns_valid_hosts_or_raises_a_one_line_spec_error(text):
    try:
        result = parse(text, source="f")
    except SpecError as exc:
        assert str(exc).startswith("f:") and "\n" not in str(exc)
        return
    for entry in result:
        assert valid_host(entry.host)
        assert entry.slots is None or entry.slots >= 1
