"""`copy` orchestration over a scripted transport: a hop dies mid-chain, the nodes behind it get a
repair chain that skips it; a hop whose disk fills is failed, not retried.

No ssh and no root: every node is a folder; manifests, the hops' status folders and the small
node programs run for real (as local shells); only the chain's network stream is scripted (its
effect: what each hop would have extracted, and the status it would have written).  The real
relay runs in tests/local/test_copy.py.
"""

from __future__ import annotations

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


def _run_id(call: Call) -> str:
    return re.search(r"copy-([0-9a-f]+)-source", call.command).group(1)


def delivers(fake: ScriptedTransport, *passes: dict[str, str]):
    """The chain's stream, one dict per pass: node -> "ok" (extracted; status rc=0 written) or
    "cut" (a partial file landed, no status: the stream ended early)."""
    left = list(passes)

    def effect(call: Call) -> None:
        for node, outcome in left.pop(0).items():
            dest = fake.home(node) / "data"
            if outcome == "ok":
                shutil.copytree(fake.home("node-1") / "data", dest, symlinks=True, dirs_exist_ok=True)
                sdir = fake.home(node) / chains.status_dir(_run_id(call), node)
                sdir.mkdir(parents=True, exist_ok=True)
                (sdir / "rc").write_text("0\n")
            else:
                dest.mkdir(parents=True, exist_ok=True)
                (dest / "a.bin").write_bytes(b"\0" * 100)

    return effect


def test_a_hop_that_dies_mid_chain_is_routed_around_and_the_nodes_behind_it_are_repaired(fake):
    fake.on("tar -c", Reply(effect=delivers(fake, {"node-2": "ok", "node-4": "cut"},
                                            {"node-4": "ok", "node-5": "ok"})))
    fake.on("next_rc", Reply.unreachable("10.0.0.3"), node="node-3")  # its sshd died with it
    lines = []
    result = copy("cp", "data", "data", strategy="chain", transport=fake, report=lines.append)

    verdicts = {n.node: (n.status, n.exit_code) for n in result.nodes}
    assert verdicts == {"node-2": ("ok", 0), "node-3": ("unreachable", 255),
                        "node-4": ("ok", 0), "node-5": ("ok", 0)}
    assert result.nodes[1].error == "unreachable: connection refused"
    assert result.passes == 2 and result.exit_code == 255 and result.verified
    heads = [c for c in fake.calls if "tar -c" in c.command]
    assert "10.0.0.2" in heads[0].command  # pass 1: leader -> node-2 -> node-3 -> ...
    assert "10.0.0.4" in heads[1].command  # the repair chain starts at node-4: no node-2, no node-3
    repair_hop = [c for c in fake.to("node-4") if c.stdin and "hop.sh" in c.command][-1]
    assert "10.0.0.5" in repair_hop.stdin and "10.0.0.3" not in repair_hop.stdin
    assert not [c for c in fake.calls if "kill -TERM" in c.command]  # nothing aborted
    assert any("re-routing around failed node(s)" in line for line in lines)
    source = (fake.home("node-1") / "data" / "a.bin").read_bytes()
    for node in ("node-2", "node-4", "node-5"):
        assert (fake.home(node) / "data" / "a.bin").read_bytes() == source


def test_a_hop_whose_disk_fills_fails_alone_and_is_not_retried(fake):
    fake.on("tar -c", Reply(effect=delivers(fake, {"node-2": "ok", "node-4": "ok", "node-5": "ok"})))
    fake.on("next_rc", Reply("rc=2\nnext_rc=0\ntar: a.bin: Cannot write: No space left on device\n"), node="node-3")
    result = copy("cp", "data", "data", strategy="chain", transport=fake)

    node3 = next(n for n in result.nodes if n.node == "node-3")
    assert (node3.status, node3.exit_code) == ("failed", 1)
    assert node3.error.startswith("disk full writing DEST")
    assert [n.status for n in result.nodes if n.node != "node-3"] == ["ok", "ok", "ok"]
    assert result.passes == 1 and result.exit_code == 1


def test_a_second_copy_sends_nothing_and_verifies(fake):
    fake.on("tar -c", Reply(effect=delivers(fake, {f"node-{i}": "ok" for i in range(2, 6)})))
    first = copy("cp", "data", "data", strategy="chain", transport=fake)
    again = copy("cp", "data", "data", strategy="chain", transport=fake)
    assert first.exit_code == 0 and first.passes == 1
    assert again.exit_code == 0 and again.passes == 0 and again.bytes_sent == 0 and again.verified
    assert len([c for c in fake.calls if "tar -c" in c.command]) == 1
