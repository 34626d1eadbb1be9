"""`copy` orchestration over a scripted transport: a hop dies mid-chain, the nodes behind it get a
repair chain that skips it; a hop whose disk fills is failed, not retried.

No ssh and no root: every node is a folder; manifests, the hops' status collection and the
small node programs run for real (as local shells); only the chain itself is scripted: its
prepare step, and the stream's effect (what each hop would have written, and the status.json
its relay would have left).  The real relay runs in tests/unit/test_relay.py (as processes)
and tests/local/test_copy.py (over sshd).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from clustertool.transfer import chain as chains
from clustertool.transfer.copy import copy
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


HEAD = "-source/relay.py"  # the chain's head: ssh to the leader's prepared source


def prepares(call: Call) -> bool:
    return call.stdin is not None and "def prepare(args)" in call.stdin


def collects(call: Call) -> bool:
    """The round after a pass: a manifest that first collects a station's status."""
    return call.stdin is not None and "def station_status(" in call.stdin and "copy-" in call.stdin.split("\n")[1]


def _run_pass(call: Call) -> tuple[str, int]:
    m = re.search(r"copy-([0-9a-f]+)-p(\d+)-source", call.command)
    return m.group(1), int(m.group(2))


def delivers(fake: ScriptedTransport, *passes: dict[str, str]):
    """The chain's stream, one dict per pass: node -> "ok" (written and verified; status.json
    left), "corrupt" (written, one file's bytes did not hash as sent) or "cut" (a partial file
    landed, no status: the stream ended early)."""
    left = list(passes)

    def effect(call: Call) -> None:
        run_id, pass_no = _run_pass(call)
        for node, outcome in left.pop(0).items():
            dest = fake.home(node) / "data"
            if outcome in ("ok", "corrupt"):
                shutil.copytree(fake.home("node-1") / "data", dest, symlinks=True, dirs_exist_ok=True)
                bad = [["content differs (written bytes do not hash as sent)", "a.bin"]] if outcome == "corrupt" else []
                status = {"rc": 0, "files": 2, "verified": 2 - len(bad), "bad": bad, "bad_count": len(bad)}
                sdir = fake.home(node) / chains.status_dir(run_id, node, pass_no)
                sdir.mkdir(parents=True, exist_ok=True)
                (sdir / "status.json").write_text(json.dumps(status))
            else:
                dest.mkdir(parents=True, exist_ok=True)
                (dest / "a.bin").write_bytes(b"\0" * 100)

    return effect


def chain_of(fake: ScriptedTransport, *passes: dict[str, str]) -> ScriptedTransport:
    fake.on(prepares, Reply())
    return fake.on(HEAD, Reply(effect=delivers(fake, *passes)))


def test_a_hop_that_dies_mid_chain_is_routed_around_and_the_nodes_behind_it_are_repaired(fake):
    fake.on(collects, Reply.unreachable("10.0.0.3"), node="node-3")  # its sshd died with it
    chain_of(fake, {"node-2": "ok", "node-4": "cut"}, {"node-4": "ok", "node-5": "ok"})
    lines = []
    result = copy("cp", "data", "data", strategy="chain", transport=fake, report=lines.append)

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
    chain_of(fake, {"node-2": "ok", "node-4": "ok", "node-5": "ok"})
    full = {"root": "data", "exists": True, "status": {"rc": 2, "err": "a.bin: No space left on device", "files": 2}}
    fake.on(collects, Reply(json.dumps(full) + "\n"), node="node-3")
    result = copy("cp", "data", "data", strategy="chain", transport=fake)

    node3 = next(n for n in result.nodes if n.node == "node-3")
    assert (node3.status, node3.exit_code) == ("failed", 1)
    assert node3.error.startswith("disk full writing DEST")
    assert [n.status for n in result.nodes if n.node != "node-3"] == ["ok", "ok", "ok"]
    assert result.passes == 1 and result.exit_code == 1


def test_a_second_copy_sends_nothing_and_verifies(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    first = copy("cp", "data", "data", strategy="chain", transport=fake)
    again = copy("cp", "data", "data", strategy="chain", transport=fake)
    assert first.exit_code == 0 and first.passes == 1
    assert again.exit_code == 0 and again.passes == 0 and again.bytes_sent == 0 and again.verified
    assert len([c for c in fake.calls if HEAD in c.command]) == 1


def _hashing_reads(fake: ScriptedTransport) -> list[Call]:
    """Manifest rounds that hash files (the re-reads verification does)."""
    return [c for c in fake.calls if c.stdin and "def station_status(" in c.stdin
            and '\\"hash\\": [\\"' in c.stdin.split("\n")[1]]


def test_a_verified_copy_reads_nothing_twice_and_a_rerun_rereads_everything(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    first = copy("cp", "data", "data", strategy="chain", transport=fake)
    assert first.exit_code == 0 and first.verify == "stream" and first.hash in ("sha256", "blake2b-128")
    assert [n.files_verified_in_stream for n in first.nodes] == [2] * 4
    assert _hashing_reads(fake) == []  # neither the source nor a node read a file again
    again = copy("cp", "data", "data", strategy="chain", transport=fake)
    assert again.exit_code == 0 and [n.files_checked for n in again.nodes] == [2] * 4
    assert {c.node for c in _hashing_reads(fake)} == {f"node-{i}" for i in range(1, 6)}


def test_a_file_a_hop_got_wrong_in_the_stream_makes_that_node_a_mismatch_naming_it(fake):
    chain_of(fake, {"node-2": "ok", "node-3": "corrupt", "node-4": "ok", "node-5": "ok"})
    result = copy("cp", "data", "data", strategy="chain", transport=fake)
    by = {n.node: n for n in result.nodes}
    assert result.exit_code == 1 and by["node-3"].status == "mismatch"
    assert by["node-3"].problems == ["content differs (written bytes do not hash as sent): a.bin"]
    assert [by[n].status for n in ("node-2", "node-4", "node-5")] == ["ok"] * 3


def test_verify_only_rereads_every_node_and_names_a_byte_changed_on_disk(fake):
    chain_of(fake, {f"node-{i}": "ok" for i in range(2, 6)})
    assert copy("cp", "data", "data", strategy="chain", transport=fake).exit_code == 0
    target = fake.home("node-4") / "data" / "a.bin"
    st = target.stat()
    target.write_bytes(b"\1" + target.read_bytes()[1:])  # same size, same mtime: only a hash sees it
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = copy("cp", "data", "data", transport=fake, verify_only=True)
    by = {n.node: n for n in result.nodes}
    assert result.exit_code == 1 and result.verify == "reread" and result.strategy == "none"
    assert by["node-4"].problems == ["content differs: a.bin"] and by["node-4"].status == "mismatch"
    assert [by[n].status for n in ("node-2", "node-3", "node-5")] == ["ok"] * 3
    assert not [c for c in fake.calls[-10:] if HEAD in c.command]  # nothing was copied
