"""Verification: the source manifest with hashes against every node's, one verdict per node."""

from __future__ import annotations

from clustertool.errors import RemoteError
from clustertool.model import Node
from clustertool.transfer import manifest as mf
from clustertool.transfer.model import CopyResult, CopyRun


def source_manifest(run: CopyRun, want_hash) -> mf.Manifest:
    """The source tree's manifest, hashing ``want_hash`` (True or a list of paths)."""
    if run.from_local:
        return mf.local(run.src, want_hash, keep=run.keep)
    leader = run.cluster.leader
    got = mf.remote(run.cluster.name, [leader], run.src, want_hash=want_hash, transport=run.transport)[leader.name]
    if isinstance(got, str):
        raise RemoteError(f"cannot hash SRC on the leader: {got}")
    return got


def source_hashes(run: CopyRun, paths: list[str]) -> dict[str, str]:
    man = source_manifest(run, paths)
    return {p: man.entries[p].get("h") for p in paths if p in man.entries}


def verify(run: CopyRun, nodes: list[Node], result: CopyResult) -> None:
    """Compare every reachable target with the source by hash; record verdicts in run.results."""
    nodes = [n for n in nodes if run.results.get(n.name) is None or run.results[n.name].status != "unreachable"]
    if not nodes:
        return
    files = [p for p, e in run.source.entries.items() if e["t"] == "f"]
    source = source_manifest(run, files)
    got = mf.remote(run.cluster.name, nodes, run.dest, want_hash=files, transport=run.transport)
    for node in nodes:
        entry = run.entry(node.name)
        man = got[node.name]
        if isinstance(man, str):
            entry.status, entry.exit_code = ("unreachable", 255) if mf.is_unreachable(man) else ("failed", 1)
            entry.error = entry.error or man
            continue
        problems = mf.compare(source, man, extras=run.delete)
        entry.files_checked = len(files)
        entry.problems = problems
        if problems and entry.status == "ok":
            entry.status, entry.exit_code = "mismatch", 1
        if problems and entry.error is None:
            entry.error = f"{len(problems)} difference(s): {mf.summarize(problems, 5)}"
