"""Verification: every node's DEST against the source by hash, one verdict per node.

Files the copy streamed to a node were hashed there as they were written and compared with
the source's hash of the bytes it sent (the relay; rsync's own checksum for the fan-out):
they are not read again.  A node whose relay wrote every entry of the source (a fresh copy)
is judged by what its relay said: content by hash, and types, permissions and link targets
as it set them.  Any other node gets one round: a listing of DEST, with every file the stream
did not check hashed from its disk and from the source's.  ``--verify-only`` re-reads all.
"""

from __future__ import annotations

import threading

from clustertool.core.errors import RemoteError
from clustertool.core.model import Node
from clustertool.transfer import manifest
from clustertool.transfer.results import CopyResult, CopyRun


def source_manifest(run: CopyRun, want_hash: manifest.WantHash) -> manifest.Manifest:
    """The source tree's manifest, hashing ``want_hash`` (True or a list of paths)."""
    if run.from_local:
        return manifest.local(run.src, want_hash, algo=run.algo, keep=run.keep)
    leader = run.cluster.leader
    got = manifest.remote(run.session, [leader], run.src, want_hash=want_hash,
                    algo=run.algo)[leader.name]
    if isinstance(got, str):
        raise RemoteError(f"cannot hash SRC on the leader: {got}")
    return got


def source_hashes(run: CopyRun, paths: list[str]) -> dict[str, str | None]:
    man = source_manifest(run, paths)
    return {p: man.entries[p].get("h") for p in paths if p in man.entries}


def _with_hashes(source: manifest.Manifest, hashes: dict[str, str | None]) -> manifest.Manifest:
    entries = {p: (dict(e, h=hashes.get(p)) if e["t"] == "f" else e) for p, e in source.entries.items()}
    return manifest.Manifest(source.root, source.exists, entries, source.error, source.is_dir)


def _reread(run: CopyRun,
            need: dict[str, list[str]]) -> tuple[dict[str, str | None], dict[str, manifest.Manifest | str]]:
    """Hash ``need`` (node -> files) on the nodes and their union at the source, at the same time."""
    every = sorted({p for paths in need.values() for p in paths})
    src: dict[str, dict[str, str | None]] = {}
    failed: list[Exception] = []

    def at_source() -> None:
        try:
            src["hashes"] = source_hashes(run, every) if every else {}
        except Exception as exc:  # handed to the caller's thread below
            failed.append(exc)

    worker = threading.Thread(target=at_source, daemon=True)
    worker.start()
    nodes = [run.cluster.node(name) for name in need]
    got = manifest.remote(run.session, nodes, run.dest, want_hash=lambda name: need[name],
                    algo=run.algo) if nodes else {}
    worker.join()
    if failed:
        raise failed[0]
    return src["hashes"], got


def verify(run: CopyRun, nodes: list[Node], result: CopyResult) -> None:
    """Judge every reachable target against the source; record verdicts in run.results."""
    nodes = [n for n in nodes if run.results.get(n.name) is None or run.results[n.name].status != "unreachable"]
    if not nodes:
        return
    files = [p for p, e in run.manifest.entries.items() if e["t"] == "f"]
    need = {}
    for node in nodes:
        trusted = run.streamed.get(node.name, set())
        missing = [p for p in files if p not in trusted]
        if missing or run.delete or not run.covered.get(node.name, set()) >= run.manifest.entries.keys():
            need[node.name] = missing
    hashes, fresh = _reread(run, need)
    source = _with_hashes(run.manifest, hashes)
    for node in nodes:
        _judge(run, node.name, fresh.get(node.name), source, len(files))


def _judge(run: CopyRun, name: str, man: manifest.Manifest | str | None, source: manifest.Manifest,
           n_files: int) -> None:
    """The node's verdict: what its stream said, plus (when it was re-read) its listing compared."""
    entry = run.entry(name)
    if isinstance(man, str):
        entry.status, entry.exit_code = ("unreachable", 255) if manifest.is_unreachable(man) else ("failed", 1)
        entry.error = entry.error or man
        return
    trusted = run.streamed.get(name, set())
    problems = list(run.stream_problems.get(name, []))
    if man is not None:
        problems += manifest.compare(source, man, extras=run.delete, verified=trusted)
    entry.files_checked = n_files
    entry.files_verified_in_stream = len(trusted)
    entry.problems = problems
    if problems and entry.status == "ok":
        entry.status, entry.exit_code = "mismatch", 1
    if problems and entry.error is None:
        entry.error = f"{len(problems)} difference(s): {manifest.summarize(problems, 5)}"
