"""`copy` orchestration over a scripted transport: a hop dies mid-chain, the nodes behind it get a
repair chain that skips it; a hop whose disk fills is failed, not retried.

No ssh and no root: every node is a folder; manifests, the hops' status collection and the
small node programs run for real (as local shells); only the chain itself is scripted: its
prepare step, and the stream's effect (what each hop would have written, and the status.json
its relay would have left).  The real relay runs in tests/unit/test_relay.py (as processes)
and tests/local/test_copy.py (over sshd).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.nodeprogs import manifest
from clustertool.transfer import chain
from clustertool.transfer.copy import copy
from clustertool.transfer.transferrequests import CopyRequest
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Call, Reply, ScriptedTransport

pytestmark = pytest.mark.unit


@pytest.fixture
def fake(tmp_path, ct_env):
    fake = ScriptedTransport(tmp_path / "nodes")
    data = fake.home("node-1") / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.bin").write_bytes(bytes(range(256)) * 64)
    (data / "sub" / "b.txt").write_text("hello\n")
    saved_cluster("cp", 5)
    return fake


def heads(call: Call) -> bool:
    """The chain's head: the source relay run on the leader (its program comes on stdin)."""
    return re.search(r"copy-[0-9a-f]+-p\d+-source", call.command) is not None


def _args(call: Call) -> dict:
    """The ARGS a node program got (its second line: ``ARGS = json.loads("...")``)."""
    line = call.stdin.split("\n")[1]
    return json.loads(ast.literal_eval(line[len("ARGS = json.loads("):-1]))


def prepares(call: Call) -> bool:
    """A round that prepares stations: a pass's own, or the survey's (prepared ahead)."""
    return call.stdin is not None and "def prepare(args)" in call.stdin


def surveys(call: Call) -> bool:
    """The copy's first round on a node: its listing, with stations prepared ahead."""
    return prepares(call) and "root" in _args(call)


def surveyed(fake: ScriptedTransport):
    """The survey's reply: the node's listing, for real, in its folder; its stations (which would
    dial out over ssh) are left to the scripted stream."""
    def reply(call: Call) -> Reply:
        args = _args(call)
        if "root" not in args:
            return Reply()  # a pass's prepare round
        out: list[str] = []
        listing = dict(args, root=str(fake.home(call.node) / args["root"]))
        listing.pop("prepare", None)
        manifest.run(listing, out.append)
        return Reply("".join(out))

    return reply


def delivers(fake: ScriptedTransport, *passes: dict[str, str]):
    """The chain's stream, one dict per pass: node -> "ok" (written and verified: its relay says
    so), "corrupt" (written, one file's bytes did not hash as sent), "full" (its disk filled)
    or "cut" (a partial file landed, and its relay never reported: the stream ended early)."""
    left = list(passes)

    def reply(call: Call) -> Reply:
        done = []
        for node, outcome in left.pop(0).items():
            dest = fake.home(node) / "data"
            if outcome == "full":
                status = {"rc": 2, "err": "a.bin: No space left on device", "files": 2,
                          "bad": [["not written", "a.bin"]]}
                done.append(f"{chain.DONE_MARK} {node} {json.dumps(status)}\n")
            elif outcome in ("ok", "corrupt"):
                shutil.copytree(fake.home("node-1") / "data", dest, symlinks=True, dirs_exist_ok=True)
                bad = [["content differs (written bytes do not hash as sent)", "a.bin"]] if outcome == "corrupt" else []
                status = {"rc": 0, "files": 2, "verified": 2 - len(bad), "bad": bad, "bad_count": len(bad)}
                done.append(f"{chain.DONE_MARK} {node} {json.dumps(status)}\n")
            else:  # cut: a partial file landed, and the relay never said it was done
                dest.mkdir(parents=True, exist_ok=True)
                (dest / "a.bin").write_bytes(b"\0" * 100)
        return Reply(stdout=json.dumps({"files": 2, "errors": [], "next_rc": 0}) + "\n", stderr="".join(done))

    return reply


def chain_of(fake: ScriptedTransport, *passes: dict[str, str]) -> ScriptedTransport:
    fake.on(prepares, surveyed(fake))
    return fake.on(heads, delivers(fake, *passes))


def test_a_hop_that_dies_mid_chain_is_routed_around_and_the_nodes_behind_it_are_repaired(fake):
    fake.on(lambda c: not surveys(c), Reply.unreachable("10.0.0.3"), node="node-3")  # died after the survey
    chain_of(fake, {"node-2": "ok", "node-4": "cut"}, {"node-4": "ok", "node-5": "ok"})
    lines = []
    result = copy(ClusterSession.load("cp", transport=fake, report=lines.append),
                  CopyRequest("data", "data", strategy="chain"))

    verdicts = {n.node: (n.status, n.exit_code) for n in result.nodes}
    assert verdicts == {"node-2": ("ok", 0), "node-3": ("unreachable", 255),
                        "node-4": ("ok", 0), "node-5": ("ok", 0)}
    assert result.nodes[1].error == "unreachable: connection refused"
    assert result.passes == 2 and result.exit_code == 255 and result.verified
    sources = [c for c in fake.to("node-1") if prepares(c)]
    assert "10.0.0.2" in sources[0].stdin  # pass 1: leader -> node-2 -> node-3 -> ...
    assert "10.0.0.4" in sources[1].stdin and "10.0.0.2" not in sources[1].stdin  # the repair starts at node-4
    repair_hop = [c for c in fake.to("node-4") if prepares(c)][-1]
    assert "10.0.0.5" in repair_hop.stdin and "10.0.0.3" not in repair_hop.stdin
    assert not [c for c in fake.calls if "kill -TERM" in c.command]  # nothing aborted
    assert any("re-routing around failed node(s)" in line for line in lines)
    source = (fake.home("node-1") / "data" / "a.bin").read_bytes()
    for node in ("node-2", "node-4", "node-5"):
        assert (fake.home(node) / "data" / "a.bin").read_bytes() == source


def test_a_hop_whose_disk_fills_fails_alone_and_is_not_retried(fake):
    chain_of(fake, {"node-2": "ok", "node-3": "full", "node-4": "ok", "node-5": "ok"})
    result = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))

    node3 = next(n for n in result.nodes if n.node == "node-3")
    assert (node3.status, node3.exit_code) == ("failed", 1)
    assert node3.error.startswith("disk full writing DEST")
    assert [n.status for n in result.nodes if n.node != "node-3"] == ["ok", "ok", "ok"]
    assert result.passes == 1 and result.exit_code == 1


def test_a_second_copy_sends_nothing_and_verifies(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    first = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))
    again = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))
    assert first.exit_code == 0 and first.passes == 1
    assert again.exit_code == 0 and again.passes == 0 and again.bytes_sent == 0 and again.verified
    assert len([c for c in fake.calls if heads(c)]) == 1


def _hashing_reads(fake: ScriptedTransport) -> list[Call]:
    """Manifest rounds that hash files (the re-reads verification does)."""
    return [c for c in fake.calls if c.stdin and "def clean_stations(" in c.stdin and _args(c).get("hash")]


def test_a_verified_copy_reads_nothing_twice_and_a_rerun_rereads_everything(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    first = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))
    assert first.exit_code == 0 and first.verify == "stream" and first.hash in ("sha256", "blake2b-128")
    assert [n.files_verified_in_stream for n in first.nodes] == [2] * 4
    assert _hashing_reads(fake) == []  # neither the source nor a node read a file again
    again = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))
    assert again.exit_code == 0 and [n.files_checked for n in again.nodes] == [2] * 4
    assert {c.node for c in _hashing_reads(fake)} == {f"node-{i}" for i in range(1, 6)}


def test_a_file_a_hop_got_wrong_in_the_stream_makes_that_node_a_mismatch_naming_it(fake):
    chain_of(fake, {"node-2": "ok", "node-3": "corrupt", "node-4": "ok", "node-5": "ok"})
    result = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain"))
    by = {n.node: n for n in result.nodes}
    assert result.exit_code == 1 and by["node-3"].status == "mismatch"
    assert by["node-3"].problems == ["content differs (written bytes do not hash as sent): a.bin"]
    assert [by[n].status for n in ("node-2", "node-4", "node-5")] == ["ok"] * 3


def test_verify_only_rereads_every_node_and_names_a_byte_changed_on_disk(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    assert copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", strategy="chain")).exit_code == 0
    target = fake.home("node-4") / "data" / "a.bin"
    st = target.stat()
    target.write_bytes(b"\1" + target.read_bytes()[1:])  # same size, same mtime: only a hash sees it
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = copy(ClusterSession.load("cp", transport=fake), CopyRequest("data", "data", verify_only=True))
    by = {n.node: n for n in result.nodes}
    assert result.exit_code == 1 and result.verify == "reread" and result.strategy == "none"
    assert by["node-4"].problems == ["content differs: a.bin"] and by["node-4"].status == "mismatch"
    assert [by[n].status for n in ("node-2", "node-3", "node-5")] == ["ok"] * 3
    assert len([c for c in fake.calls if heads(c)]) == 1  # --verify-only copied nothing
