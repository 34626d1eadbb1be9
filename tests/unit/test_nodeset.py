"""Node-set patterns: expand, fold, and selecting nodes of a cluster."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, ClusterRecord, Node
from clustertool.core.nodeset import expand, fold, natural_key, select

pytestmark = pytest.mark.unit


def make_cluster(count: int = 4, leader: int = 1, name: str = "demo") -> ClusterRecord:
    nodes = [
        Node(name=f"node-{i}", index=i, address=f"10.213.0.{i + 1}",
             role=LEADER if i == leader else "member")
        for i in range(1, count + 1)
    ]
    return ClusterRecord(name=name, provider="local", nodes=nodes)


# --- expand -------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, names", [
    ("node-7", ["node-7"]),
    ("node-[2-5]", ["node-2", "node-3", "node-4", "node-5"]),
    ("node-[2-5],node-7,leader", ["node-2", "node-3", "node-4", "node-5", "node-7", "leader"]),
    ("node-[1-3,5]", ["node-1", "node-2", "node-3", "node-5"]),
    ("node-[08-11]", ["node-08", "node-09", "node-10", "node-11"]),
    ("n[001-002]", ["n001", "n002"]),
    ("10.0.0.[1-3]", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    ("r[1-2]-g[1-2]", ["r1-g1", "r1-g2", "r2-g1", "r2-g2"]),
    ("node-[1-3]-ib", ["node-1-ib", "node-2-ib", "node-3-ib"]),
    ("node-[3],node-3,node-[1-3]", ["node-3", "node-1", "node-2"]),
])
def test_expand_lists_every_name_in_written_order_without_duplicates(pattern, names):
    assert expand(pattern) == names


@pytest.mark.parametrize("pattern, fragment", [
    ("", "empty"),
    ("node-1;reboot", "';'"),
    ("node-1 node-2", "' '"),
    ("node-$(id)", "'$'"),
    ("node-`id`", "'`'"),
    ("node-1|sh", "'|'"),
    ("node-1\nnode-2", "'\\n'"),
    ("node-[1-3", "unclosed"),
    ("node-1-3]", "unbalanced"),
    ("node-[[1-3]]", "nested"),
    ("node-[]", "empty brackets"),
    ("node-[1,,3]", "empty item"),
    ("node-1,,node-2", "empty item"),
    ("node-[5-2]", "backwards"),
    ("node-[a-c]", "expected N or N-M"),
    ("node-[1-2-3]", "expected N or N-M"),
    ("node-[1-05]", "padding"),
    ("node-[1-999999999]", "too large"),
    ("a[1-1000]b[1-1000]", "too many"),
])
def test_expand_rejects_bad_patterns_with_a_usage_error(pattern, fragment):
    with pytest.raises(UsageError) as info:
        expand(pattern)
    assert fragment in str(info.value)


# --- fold ---------------------------------------------------------------------------------

@pytest.mark.parametrize("names, folded", [
    (["node-1", "node-2", "node-3", "node-5"], "node-[1-3,5]"),
    (["node-5", "node-3", "node-1", "node-2"], "node-[1-3,5]"),
    (["node-1"], "node-1"),
    (["node-2", "node-10", "node-9"], "node-[2,9-10]"),
    (["leader", "node-1", "node-2"], "leader,node-[1-2]"),
    (["gpu-1", "node-1", "node-2", "cpu-3"], "cpu-3,gpu-1,node-[1-2]"),
    (["node-08", "node-09", "node-10"], "node-[08-10]"),
    (["node-1", "node-01"], "node-[1,01]"),
    (["10.0.0.1", "10.0.0.2", "10.0.1.1"], "10.0.0.[1-2],10.0.1.1"),
    (["n1-ib", "n2-ib"], "n[1-2]-ib"),
    ([], ""),
])
def test_fold_makes_clustershell_style_ranges(names, folded):
    assert fold(names) == folded


def test_fold_refuses_names_that_could_not_round_trip():
    with pytest.raises(UsageError):
        fold(["node-[1]"])


def test_natural_key_orders_numbers_by_value():
    assert sorted(["node-10", "node-2", "node-1"], key=natural_key) == ["node-1", "node-2", "node-10"]


# --- properties ---------------------------------------------------------------------------

prefixes = st.sampled_from(["node-", "n", "gpu", "rack1-n", "10.0.0.", "leader", "x_"])
suffixes = st.sampled_from(["", "", "", "-ib", ".lan"])


@st.composite
def node_names(draw):
    prefix, suffix = draw(prefixes), draw(suffixes)
    if draw(st.booleans()) and not prefix[-1].isdigit():
        return prefix.rstrip("-_.") + suffix or "leader"
    value = draw(st.integers(min_value=0, max_value=150))
    width = draw(st.sampled_from([0, 0, 0, 2, 3]))
    return f"{prefix}{str(value).zfill(width)}{suffix}"


name_lists = st.lists(node_names(), max_size=40)


@given(name_lists)
@settings(max_examples=300, deadline=None)
def test_expand_of_fold_gives_back_exactly_the_set_of_names(names):
    expanded = expand(fold(names)) if names else []
    assert len(expanded) == len(set(expanded))
    assert set(expanded) == set(names)


@given(st.sets(st.integers(min_value=0, max_value=500), max_size=60))
@settings(max_examples=200, deadline=None)
def test_expand_of_fold_is_naturally_sorted_for_plain_node_names(values):
    names = [f"node-{v}" for v in values]
    expected = sorted(set(names), key=natural_key)
    assert (expand(fold(names)) if names else []) == expected


@given(name_lists)
@settings(max_examples=300, deadline=None)
def test_fold_of_expand_of_a_folded_set_is_the_same_text(names):
    folded = fold(names)
    if folded:
        assert fold(expand(folded)) == folded


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_expanding_a_written_range_list_matches_python_ranges(ranges):
    body = ",".join(f"{lo}-{lo + span}" for lo, span in ranges)
    expected = []
    for lo, span in ranges:
        expected.extend(f"node-{v}" for v in range(lo, lo + span + 1) if f"node-{v}" not in expected)
    assert expand(f"node-[{body}]") == expected
    assert set(expand(fold(expected))) == set(expected)


@given(st.text(max_size=30))
@settings(max_examples=300, deadline=None)
def test_expand_never_accepts_shell_metacharacters_or_whitespace(text):
    try:
        names = expand(text)
    except UsageError:
        return
    for name in names:
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


# --- select -------------------------------------------------------------------------------

def names_of(nodes):
    return [n.name for n in nodes]


def test_select_none_or_all_gives_every_node_leader_first():
    cluster = make_cluster(4, leader=3)
    assert names_of(select(cluster, None)) == ["node-3", "node-1", "node-2", "node-4"]
    assert names_of(select(cluster, "all")) == ["node-3", "node-1", "node-2", "node-4"]


def test_select_leader_and_members():
    cluster = make_cluster(4, leader=2)
    assert names_of(select(cluster, "leader")) == ["node-2"]
    assert names_of(select(cluster, "members")) == ["node-1", "node-3", "node-4"]


def test_select_ranges_and_lists_come_back_in_cluster_order_without_duplicates():
    cluster = make_cluster(6)
    assert names_of(select(cluster, "node-5,node-[2-3],node-2,leader")) == [
        "node-1", "node-2", "node-3", "node-5"]


def test_select_accepts_the_ssh_aliases_of_the_cluster():
    cluster = make_cluster(4, name="demo")
    assert names_of(select(cluster, "demo-leader")) == ["node-1"]
    assert names_of(select(cluster, "demo-node-3,demo-node-[1-2]")) == ["node-1", "node-2", "node-3"]


def test_select_accepts_node_addresses():
    cluster = make_cluster(3)
    assert names_of(select(cluster, "10.213.0.3")) == ["node-2"]


def test_select_unknown_node_names_it_and_lists_valid_names_folded():
    cluster = make_cluster(4, name="demo")
    with pytest.raises(UsageError) as info:
        select(cluster, "node-[3-7]")
    message = str(info.value)
    assert "node-[5-7]" in message
    assert "node-[1-4]" in message
    assert "leader" in message and "members" in message


@pytest.mark.parametrize("selection", [
    "node-1;rm -rf /", "node-1 node-2", "$(reboot)", "node-1&&id", "node-1'", "", "node-1\t",
])
def test_select_rejects_shell_metacharacters_and_whitespace(selection):
    with pytest.raises(UsageError):
        select(make_cluster(), selection)


def test_select_of_another_clusters_alias_is_unknown():
    with pytest.raises(UsageError) as info:
        select(make_cluster(name="demo"), "other-leader")
    assert "other-leader" in str(info.value)
