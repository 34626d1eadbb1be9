"""copy's file filter (what `run --sync` uses) over a scripted transport: ignored files are never
streamed nor verified, and a re-run streams only what changed.

No ssh and no root: each node is a folder; the manifests, status folders and verification run for
real there; only the relay's stream is replaced (it records the names it was given and lands those
files on every node).  The real relay: tests/local/test_run_sync.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import UsageError
from clustertool.transfer import chain, drive
from clustertool.transfer.copy import choose_strategy, copy
from clustertool.transfer.ignore import Matcher
from clustertool.transfer.transferrequests import CopyRequest
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import ScriptedTransport

pytestmark = pytest.mark.unit

NODES = ("node-1", "node-2", "node-3")


@pytest.fixture
def setup(tmp_path, ct_env, monkeypatch):
    fake = ScriptedTransport(tmp_path / "nodes")
    saved_cluster("sy", 3)
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "data").mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "big.bin").write_bytes(b"\0" * 100_000)
    (src / "data" / "part.csv").write_text("1,2\n")
    (src / ".gitignore").write_text("*.bin\ndata/\n")
    streamed: list[list[str]] = []

    def stream(argv, stdin=None, *, on_progress=None, timeout=None):
        """The relay: every node gets exactly the entries the source was told to send, and each hop
        says rc=0 (hashing nothing: verification then re-reads every node, for real)."""
        args = json.loads(json.loads(re.search(rb'ARGS = json.loads\((".*?")\)\n', stdin).group(1)))
        names = args["source"]["names"]
        streamed.append(list(names))
        for node in NODES:
            dest = fake.home(node) / "proj"
            dest.mkdir(exist_ok=True)
            for name in names:
                (dest / name).mkdir(parents=True, exist_ok=True) if (src / name).is_dir() else \
                    shutil.copy2(src / name, dest / name)
        return chain.ChainRun(0, "", 0.0, done={node: {"rc": 0} for node in NODES})

    monkeypatch.setattr(drive.chain, "stream", stream)
    # no stations either (ahead, in the survey, or per pass): a real one on a fake node forks a dialer
    # that ssh-es to the next hop's address (10.0.0.x, no node of ours) and waits there for ever
    monkeypatch.setattr(drive.stations, "ahead", lambda run: ({}, []))
    monkeypatch.setattr(drive.stations, "prepare", lambda run, route, pass_no: route)
    return fake, src, streamed


def files_on(fake, node: str) -> list[str]:
    root = fake.home(node) / "proj"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def sync(fake, src: Path):
    session = ClusterSession.load("sy", transport=fake)
    return copy(session, CopyRequest(str(src), "proj", source="local"), keep=Matcher(str(src)).keep)


def test_ignored_files_are_never_streamed_and_the_rest_is_verified_on_every_node(setup):
    fake, src, streamed = setup
    result = sync(fake, src)
    assert streamed == [[".gitignore", "pkg", "pkg/mod.py", "train.py"]]
    assert result.strategy == "chain" and result.verified and result.exit_code == 0
    assert [(n.node, n.status, n.files_checked) for n in result.nodes] == [(n, "ok", 3) for n in NODES]
    assert all(files_on(fake, n) == [".gitignore", "pkg/mod.py", "train.py"] for n in NODES)


def test_a_second_sync_streams_only_the_changed_file(setup):
    fake, src, streamed = setup
    sync(fake, src)
    (src / "pkg" / "mod.py").write_text("X = 2  # changed\n")
    (src / "big.bin").write_bytes(b"\1" * 200_000)  # ignored: its change sends nothing
    result = sync(fake, src)
    assert streamed[1] == ["pkg", "pkg/mod.py"]  # the file and the folder it lives in
    assert result.bytes_sent == len("X = 2  # changed\n")
    assert [n.files_sent for n in result.nodes] == [1, 1, 1]
    assert sync(fake, src).bytes_sent == 0 and len(streamed) == 2  # nothing changed: no stream at all


def test_files_only_on_the_nodes_are_left_alone(setup):
    fake, src, _ = setup
    sync(fake, src)
    (fake.home("node-2") / "proj" / "out.log").write_text("the job's output")
    assert sync(fake, src).exit_code == 0
    assert (fake.home("node-2") / "proj" / "out.log").read_text() == "the job's output"


@pytest.mark.parametrize("kwargs, needle", [
    ({"source": "leader"}, "local SRC only"),
    ({"source": "local", "delete": True}, "without --delete"),
    ({"source": "local", "strategy": "fanout"}, "fanout cannot leave out ignored files"),
])
def test_a_filter_is_refused_where_it_cannot_hold(setup, kwargs, needle):
    fake, src, streamed = setup
    with pytest.raises(UsageError, match=needle):
        copy(ClusterSession.load("sy", transport=fake), CopyRequest(str(src), "proj", **kwargs),
             keep=lambda rel, is_dir: True)
    assert fake.calls == [] and streamed == []


def test_a_filtered_copy_always_goes_by_chain():
    assert choose_strategy("auto", 1, 10, filtered=True) == "chain"
    assert choose_strategy("auto", 1, 10) == "fanout"
