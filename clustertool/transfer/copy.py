"""`copy`: SRC (on the leader, or here) to DEST on the selected nodes, incremental and verified.

Steps: manifests of source and nodes -> per-node plans (what each lacks) -> small fixes
(deletes, metadata) -> transfer (pipelined chain or parallel rsync fan-out; both hash what they
write while writing it) -> hop statuses -> repair chains for nodes cut off behind a failed hop ->
verification (what the stream checked, plus a re-read of what it did not carry; verify.py) ->
one result per node.  Everything comes back as data.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from typing import Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.core.words import counted
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_nodes
from clustertool.sharedfs import mount
from clustertool.transfer import drive, manifest, plan, stations, verify
from clustertool.transfer.results import CopyResult, CopyRun, NodeCopy, ProgressCb, relative_remote
from clustertool.transfer.transferrequests import CopyRequest

Unwritable = Callable[[str, str, str], ToolError]  # (DEST, the nodes, why) -> the error the caller words
AUTO_CHAIN_MIN_BYTES = 32 << 20
AUTO_CHAIN_MIN_NODES = 3


def _targets(cluster: ClusterRecord, selection: str | None, from_local: bool) -> list[Node]:
    if selection is None and not from_local and len(cluster.nodes) > 1:
        selection = "members"
    nodes = nodeset.select(cluster, selection)
    if not nodes:
        raise UsageError("no nodes selected", hint="see --nodes")
    return sorted(nodes, key=lambda n: n.index)


def _source_manifest(run: CopyRun, prepare: list[dict] | None = None) -> manifest.Manifest:
    where = "here" if run.from_local else f"on the leader ({run.cluster.leader.name})"
    man: manifest.Manifest | str
    if run.from_local:
        man = manifest.local(run.src, pick_hash=True, keep=run.keep)
    else:
        got = manifest.remote(run.session, [run.cluster.leader], run.src, timeout=600,
                        pick_hash=True, prepare=(lambda n: prepare) if prepare else None)
        man = got[run.cluster.leader.name]
        if isinstance(man, str):
            raise UsageError(f"cannot read SRC {run.src!r} {where}: {man}")
    if man.error:
        raise UsageError(f"cannot read SRC {run.src!r} {where}: {man.error}")
    if not man.exists:
        raise _no_source(run)
    bad = [p for p, e in man.entries.items() if e["t"] in ("?", "o")]
    if bad:
        raise UsageError(f"SRC holds entries that cannot be copied (unreadable or special files): "
                         f"{manifest.summarize(bad, 5)}")
    run.algo = man.fastest
    return man


def _no_source(run: CopyRun) -> UsageError:
    """SRC is not where --from says: the fixed command when it is here (not on the leader)."""
    if run.from_local:
        return UsageError(f"SRC {run.src!r} does not exist here", hint="a path on this machine (relative: to this "
                                                                       "folder), or --from leader for one there")
    asked = run.asked
    leader = run.cluster.leader.name
    if asked is not None and os.path.lexists(os.path.expanduser(asked.src)):
        nodes = f" --nodes {shlex.quote(asked.nodes)}" if asked.nodes else ""
        return UsageError(f"SRC {asked.src!r} is not on the leader ({leader}), but it is here",
                          hint=f"clustertool copy -c {run.cluster.name}{nodes} --from local {shlex.quote(asked.src)} "
                               f"{shlex.quote(asked.dest)}")
    return UsageError(f"SRC {run.src!r} is neither on the leader ({leader}) nor here",
                      hint="a path on the leader (relative: to its home), or --from local with a path here")


def _unwritable(run: CopyRun, dests: dict[str, manifest.Manifest | str]) -> None:
    """Every target refused DEST, for one reason, before anything was sent: the copy stops there, in one line."""
    why = {d.unwritable if isinstance(d, manifest.Manifest) else None for n, d in dests.items()
           if n in {t.name for t in run.targets}}
    if len(why) == 1 and None not in why:
        where = nodeset.fold(n.name for n in run.targets)
        if run.unwritable_says is not None:  # DEST came from another flag (run --sync-to): it says it its way
            raise run.unwritable_says(run.dest, where, str(why.pop()))
        raise UsageError(f"cannot write DEST {run.dest!r} on {where}: {why.pop()}",
                         hint="give a folder the nodes can write, e.g. /scratch/data (`clustertool exec -c "
                              f"{run.cluster.name} -- ls -ld DIR` shows one)")


def _chain_likely(run: CopyRun, strategy: str) -> bool:
    return strategy == "chain" or (strategy == "auto" and len(run.targets) >= AUTO_CHAIN_MIN_NODES)


def survey(run: CopyRun, strategy: str) -> dict[str, plan.NodePlan]:
    """The first round, all at once: SRC's manifest (and the fastest hash) at the source, every
    target's DEST, and where a chain is likely, its stations prepared ahead (stations.py)."""
    hop_st, src_st = stations.ahead(run) if _chain_likely(run, strategy) else ({}, [])
    got: dict[str, manifest.Manifest] = {}
    failed: list[BaseException] = []

    def at_source() -> None:
        try:
            got["source"] = _source_manifest(run, src_st)
        except BaseException as exc:  # raised in the caller's thread below
            failed.append(exc)

    worker = threading.Thread(target=at_source, daemon=True)
    worker.start()
    nodes = list(run.targets)
    if hop_st.get(run.cluster.leader.name) and all(not n.is_leader for n in nodes):
        nodes.append(run.cluster.leader)  # from local: the leader relays for the members
    dests = manifest.remote(run.session, nodes, run.dest, timeout=600,
                      prepare=lambda n: hop_st.get(n.name), writable=True)
    worker.join()
    if failed:
        raise failed[0]
    run.source = got["source"]
    _unwritable(run, dests)
    return _plans(run, run.targets, dests)


def replan(run: CopyRun, nodes: list[Node]) -> dict[str, plan.NodePlan]:
    """What each of ``nodes`` lacks, from its own disk (repairs after a cut chain)."""
    return _plans(run, nodes, manifest.remote(run.session, nodes, run.dest, timeout=600))


def _plans(run: CopyRun, nodes: list[Node], dests: dict[str, manifest.Manifest | str]) -> dict[str, plan.NodePlan]:
    out: dict[str, plan.NodePlan] = {}
    for node in nodes:
        dest = dests[node.name]
        if isinstance(dest, str):
            run.fail(node.name, dest)
        elif dest.exists and not dest.is_dir:
            run.fail(node.name, f"DEST {run.dest!r} exists and is not a directory")
        elif dest.unwritable:
            run.fail(node.name, f"cannot write DEST {run.dest!r}: {dest.unwritable}")
        else:
            out[node.name] = plan.plan_node(node.name, run.manifest, dest, delete=run.delete)
    _settle_hashes(run, out)
    return out


def _settle_hashes(run: CopyRun, node_plans: dict[str, plan.NodePlan]) -> None:
    """Same size, other mtime: hash both sides, then send or only fix metadata."""
    need = {name: p.hash_check for name, p in node_plans.items() if p.hash_check}
    if not need:
        return
    every = sorted({path for paths in need.values() for path in paths})
    src_hashes = verify.source_hashes(run, every)
    nodes = [run.cluster.node(name) for name in need]
    got = manifest.remote(run.session, nodes, run.dest, want_hash=lambda name: need[name],
                    algo=run.algo)
    for name, paths in need.items():
        man = got[name]
        dest_hashes = {} if isinstance(man, str) else {p: man.entries.get(p, {}).get("h") for p in paths}
        plan.resolve_hashes(node_plans[name], src_hashes, dest_hashes, run.manifest)


def _apply_ops(run: CopyRun, node_plans: dict[str, plan.NodePlan]) -> None:
    todo = {n: p for n, p in node_plans.items() if p.delete or p.touch}
    if not todo:
        return
    nodes = [run.cluster.node(n) for n in todo]
    group = run_on_nodes(
        run.session, nodes, python_command(), timeout=600,
        stdin_data=lambda node: program_text("ops", {
            "root": relative_remote(run.dest), "delete": todo[node.name].delete,
            "touch": todo[node.name].touch}))
    for r in group.failed():
        run.fail(r.node, r.reason)


def choose_strategy(strategy: str, n_nodes: int, payload: int, filtered: bool = False) -> str:
    """chain or fanout; a filtered source (``keep``) always goes by chain, which sends exactly the
    listed entries (rsync would send the whole tree)."""
    if strategy not in ("auto", "chain", "fanout"):
        raise UsageError(f"--strategy {strategy!r}: use auto, chain or fanout", hint="e.g. --strategy chain (auto "
                                                                                      "picks by size and nodes)")
    if filtered:
        if strategy == "fanout":
            raise UsageError("--strategy fanout cannot leave out ignored files", hint="use auto or chain")
        return "chain"
    if strategy != "auto":
        return strategy
    return "chain" if n_nodes >= AUTO_CHAIN_MIN_NODES and payload >= AUTO_CHAIN_MIN_BYTES else "fanout"


def copy(session: ClusterSession, request: CopyRequest, *, on_progress: ProgressCb | None = None,
         keep: manifest.Keep | None = None, unwritable_says: Unwritable | None = None) -> CopyResult:
    """Copy, or with ``request.verify_only`` only compare every node's DEST with SRC (re-reading both).
    Progress lines go to the session's reporter, each node's bytes to ``on_progress``; ``unwritable_says(dest,
    nodes, why)``: the error for a DEST no node can write, where DEST came from another flag than copy's.

    ``keep(rel, is_dir)`` (a local SRC only) picks the entries that are part of the source: the rest
    is neither sent nor verified (nor deletable)."""
    transport, report = session.transport, session.report
    started = time.monotonic()
    src, dest, source, selection = request.src, request.dest, request.source, request.nodes
    if keep is not None and (source != "local" or request.delete):
        raise UsageError("a file filter works on a local SRC only (--from local), without --delete")
    choose_strategy(request.strategy, 0, 0, keep is not None)  # reject a bad strategy before touching any node
    cluster = session.ready()
    from_local = source == "local"
    src = os.path.abspath(os.path.expanduser(src)) if from_local else relative_remote(src)
    shared = mount.mount_under(cluster, dest)
    if shared:  # every node sees DEST: write it once, on the leader
        selection = "leader"
        report(mount.write_once_line(cluster, dest, shared))
    run = CopyRun(cluster, src, relative_remote(dest), from_local, _targets(cluster, selection, from_local),
                  request.delete, request.cipher, on_progress, report, transport, keep=keep, verify=request.verify,
                  asked=request, unwritable_says=unwritable_says)
    if not from_local and src == run.dest and any(n.is_leader for n in run.targets):
        raise UsageError("SRC and DEST are the same path on the leader", hint="use --nodes members")
    timings: dict[str, float] = {}
    if request.verify_only:
        run.source = _source_manifest(run)
        return _verify_only(run, started, timings)
    try:
        return _copy(run, request.strategy, started, timings)
    except BaseException:  # a stop of any kind: no station of this run stays on a node
        stations.abort(run, [cluster.leader] + run.targets)
        raise
    finally:
        stations.finish(run)


def _copy(run: CopyRun, strategy: str, started: float, timings: dict[str, float]) -> CopyResult:
    node_plans = survey(run, strategy)
    timings["survey"] = time.monotonic() - started
    _apply_ops(run, node_plans)
    timings["plan"] = time.monotonic() - started
    live = [n for n in run.targets if n.name not in run.results]
    union = plan.union_send([node_plans[n.name] for n in live], run.manifest)
    payload = plan.payload_bytes(union, run.manifest)
    chosen = choose_strategy(strategy, len(live), payload, run.keep is not None)
    run.report(f"{counted(len(run.manifest.entries), 'entry', 'entries')}, "
               f"{counted(run.manifest.total_bytes, 'byte')} at the source; {counted(payload, 'byte')} to send "
               f"({chosen}, {counted(len(live), 'node')})")
    result = CopyResult(run.src, run.dest, "local" if run.from_local else run.cluster.leader.name, chosen, [],
                        run.manifest.total_bytes, run.manifest.file_count,
                        verify="stream" if run.verify else "off", hash=run.algo if run.verify else None)
    if chosen == "chain":
        drive.chain_transfer(run, node_plans, live, result, replan=lambda nodes: replan(run, nodes))
    else:
        drive.fanout_transfer(run, node_plans, live, result)
    stations.discard_ahead(run)  # prepared ahead for a chain that was not needed
    timings["transfer"] = time.monotonic() - started
    if run.verify:
        verify.verify(run, run.targets, result)
        result.verified = True
    timings["verify"] = time.monotonic() - started
    for node in run.targets:
        base = run.results.get(node.name) or NodeCopy(node.name)
        if base.status == "ok":  # a node that failed counts only what reached it
            base.files_sent = base.files_sent or len([p for p in node_plans.get(node.name, plan.NodePlan("")).send
                                                      if run.manifest.entries[p]["t"] == "f"])
        result.nodes.append(base)
    return _finish(run, result, started, timings)


def _finish(run: CopyRun, result: CopyResult, started: float, timings: dict[str, float]) -> CopyResult:
    result.source_errors = list(run.source_errors)
    result.timings = timings
    result.duration = time.monotonic() - started
    return result


def _verify_only(run: CopyRun, started: float, timings: dict[str, float]) -> CopyResult:
    """No transfer: hash every file on every node and at the source, compare, one verdict each."""
    result = CopyResult(run.src, run.dest, "local" if run.from_local else run.cluster.leader.name, "none", [],
                        run.manifest.total_bytes, run.manifest.file_count, verify="reread", hash=run.algo)
    run.report(f"re-reading {counted(run.manifest.file_count, 'file')} ({counted(run.manifest.total_bytes, 'byte')}) "
               f"at the source and on {counted(len(run.targets), 'node')}, hash {run.algo}")
    verify.verify(run, run.targets, result)
    result.verified = True
    timings["verify"] = time.monotonic() - started
    result.nodes = [run.results.get(n.name) or NodeCopy(n.name) for n in run.targets]
    return _finish(run, result, started, timings)
