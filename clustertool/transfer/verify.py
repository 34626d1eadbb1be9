"""Verification: the source manifest with hashes against every node's, one verdict per node."""

from __future__ import annotations

from clustertool.transfer import manifest as mf


def source_manifest(job, want_hash) -> mf.Manifest:
    """The source tree's manifest, hashing ``want_hash`` (True or a list of paths)."""
    if job.from_local:
        return mf.local(job.src, want_hash)
    got = mf.remote(job.cluster.name, [job.cluster.leader], job.src, want_hash=want_hash)[job.cluster.leader.name]
    if isinstance(got, str):
        from clustertool.errors import RemoteError

        raise RemoteError(f"cannot hash SRC on the leader: {got}")
    return got


def source_hashes(job, paths: list[str]) -> dict[str, str]:
    man = source_manifest(job, paths)
    return {p: man.entries[p].get("h") for p in paths if p in man.entries}


def verify(job, nodes, result) -> None:
    """Compare every reachable target with the source by hash; record verdicts in job.results."""
    from clustertool.transfer.copy import NodeCopy

    nodes = [n for n in nodes if job.results.get(n.name) is None or job.results[n.name].status != "unreachable"]
    if not nodes:
        return
    files = [p for p, e in job.source.entries.items() if e["t"] == "f"]
    source = source_manifest(job, files)
    got = mf.remote(job.cluster.name, nodes, job.dest, want_hash=files)
    for node in nodes:
        entry = job.results.setdefault(node.name, NodeCopy(node.name))
        man = got[node.name]
        if isinstance(man, str):
            entry.status, entry.exit_code = ("unreachable", 255) if mf.is_unreachable(man) else ("failed", 1)
            entry.error = entry.error or man
            continue
        problems = mf.compare(source, man, extras=job.delete)
        entry.files_checked = len(files)
        entry.problems = problems
        if problems and entry.status == "ok":
            entry.status, entry.exit_code = "mismatch", 1
        if problems and entry.error is None:
            entry.error = f"{len(problems)} difference(s): {mf.summarize(problems, 5)}"
