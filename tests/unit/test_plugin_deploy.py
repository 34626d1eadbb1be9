"""`plugin deploy` is all or nothing, over a scripted transport: one node failing to stage (or
staging other bytes) rolls every node back before any is switched; status names unreachable nodes.

Every node's reply is scripted (deploy writes under absolute folders such as /opt, which these
tests must not touch); the real deploy runs against sshd in tests/local/test_plugin_local.py.
"""

from __future__ import annotations

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.plugin import build, deploy
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Call, Reply, ScriptedTransport

pytestmark = pytest.mark.unit

DEST = "/opt/clustertool/lib"


@pytest.fixture
def plugin_build(tmp_path) -> build.Build:
    folder = tmp_path / "build"
    folder.mkdir()
    for name in build.ARTEFACTS:
        (folder / name).write_bytes(b"\x7fELF " + name.encode() + b" clustertool-nccl-plugin 9.9.9\0")
    return build.describe(folder)


@pytest.fixture
def fake(tmp_path):
    return ScriptedTransport(tmp_path / "nodes")


@pytest.fixture
def cluster(ct_env):
    return saved_cluster("pd", 3)


def sums(b: build.Build, wrong: str | None = None) -> str:
    return "".join(f"{'0' * 64 if name == wrong else digest}  {name}\n" for name, digest in b.files.items())


def staging(call: Call) -> bool:
    return "tar -xzf" in call.command


def committing(call: Call) -> bool:
    return "mv -f" in call.command


def aborting(call: Call) -> bool:
    return call.command.startswith("rm -rf") and ".staging-" in call.command


def test_one_node_failing_to_stage_leaves_every_node_untouched(fake, cluster, plugin_build):
    fake.on(staging, Reply(stderr="tar: libnccl-net-clustertool.so: Cannot write: No space left on device\n", code=2),
            node="node-2")
    fake.on(staging, Reply(sums(plugin_build)))
    fake.on(aborting, Reply())
    with pytest.raises(ToolError) as info:
        deploy.deploy(ClusterSession(cluster, fake), plugin_build, dest=DEST)
    assert info.value.message == ("plugin deploy stopped before changing any node: node-2: exit 2: "
                                  "tar: libnccl-net-clustertool.so: Cannot write: No space left on device")
    assert sorted(c.node for c in fake.calls if aborting(c)) == ["node-1", "node-2", "node-3"]
    assert not [c for c in fake.calls if committing(c)]
    assert "deployed" not in build.load_record("pd")


def test_a_node_that_staged_other_bytes_rolls_everyone_back(fake, cluster, plugin_build):
    fake.on(staging, Reply(sums(plugin_build, wrong=build.TUNER_LIB)), node="node-3")
    fake.on(staging, Reply(sums(plugin_build)))
    fake.on(aborting, Reply())
    with pytest.raises(ToolError, match=f"node-3: checksum differs for {build.TUNER_LIB}"):
        deploy.deploy(ClusterSession(cluster, fake), plugin_build, dest=DEST)
    assert len([c for c in fake.calls if aborting(c)]) == 3 and not [c for c in fake.calls if committing(c)]


def test_every_node_staged_right_is_switched_over_and_recorded(fake, cluster, plugin_build):
    fake.on(staging, Reply(sums(plugin_build)))
    fake.on(committing, Reply(sums(plugin_build) + "LD_LIBRARY_PATH=/usr/local/cuda/lib64\n"))
    rows = deploy.deploy(ClusterSession(cluster, fake), plugin_build, dest=DEST)
    assert [(r.node, r.matches) for r in rows] == [("node-1", True), ("node-2", True), ("node-3", True)]
    staged = [c for c in fake.calls if staging(c)]
    assert len(staged) == 3 and all(c.stdin is not None for c in staged)  # the artefacts travel on stdin
    assert not [c for c in fake.calls if aborting(c)]
    record = build.load_record("pd")["deployed"]
    assert record["dest"] == DEST and record["ld_library_path"] == "/usr/local/cuda/lib64"


def test_status_names_an_unreachable_node_and_a_node_without_the_plugin(fake, cluster, plugin_build):
    fake.on("sha256sum", Reply.unreachable("10.0.0.2"), node="node-2")
    fake.on("sha256sum", Reply(""), node="node-3")
    fake.on("sha256sum", Reply(sums(plugin_build) + "clustertool-nccl-plugin 9.9.9\n"))
    rows = {r.node: r for r in deploy.status(ClusterSession(cluster, fake), plugin_build, dest=DEST)}
    assert rows["node-1"].matches and rows["node-1"].version == "9.9.9"
    assert (rows["node-2"].matches, rows["node-2"].error) == (False, "unreachable: connection refused")
    assert (rows["node-3"].matches, rows["node-3"].error) == (False, "not installed")
