"""The driver of both transfer strategies: chain passes (with repair chains) and the rsync fan-out.

``copy`` plans and verifies; this module moves the bytes.  A chain pass streams what any node
lacks through every pending node; nodes cut off behind a dead hop are re-planned from their
own disks (``replan``, handed in by copy) and get a repair chain that skips the dead node.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from clustertool.core.model import Node
from clustertool.core.state import ClusterPaths
from clustertool.core.words import counted
from clustertool.transfer import chain, fanout, plan, stations
from clustertool.transfer.results import CopyResult, CopyRun

TRUNCATED_MARKERS = ("unexpected end of stream", "stream cut")
REPAIR_PASSES = 2

Replan = Callable[[list[Node]], dict[str, plan.NodePlan]]  # nodes -> what each lacks now


def _one_pass(run: CopyRun, pending: list[Node], union: list[str],
              pass_no: int) -> dict[str, chain.HopStatus | str]:
    route = stations.hops(run, pending)
    if pass_no == 1 and stations.use_ahead(run, route):
        pass_no = stations.AHEAD  # its links are up already
    else:
        route = stations.prepare(run, route, pass_no)
    if not route:
        return {}
    total = plan.payload_bytes(union, run.manifest)
    progress = None
    if run.on_progress is not None:
        progress = lambda node, done: run.on_progress(node, min(done, total), total)  # noqa: E731
    argv, stdin = stations.head(run, route[0][0], union, pass_no)
    try:
        streamed = chain.stream(argv, stdin, on_progress=progress)
    except BaseException:  # Ctrl-C: the hops would go on without us; stop them
        stations.abort(run, [run.cluster.leader] + run.targets)
        raise
    errors = (streamed.source or {}).get("errors") or []
    run.source_errors += [e for e in errors if e not in run.source_errors]
    out: dict[str, chain.HopStatus | str] = {}
    for node, _ in route:
        out[node.name] = chain.hop_status(node.name, streamed.done.get(node.name))
    head = out[route[0][0].name]
    if streamed.returncode != 0 and streamed.stderr:
        assert isinstance(head, chain.HopStatus)  # every hop's status was set just above
        head.stderr = (head.stderr + "; " + streamed.stderr[-300:]).strip("; ")
    return out


def abort(run: CopyRun, nodes: list[Node]) -> None:
    """Stop this run's pipelines on the nodes (best effort: an interrupt is under way)."""
    stations.abort(run, nodes)


def truncated(st: chain.HopStatus) -> bool:
    """Did this hop fail only because its input stream was cut (an upstream hop died)?"""
    if st.rc in ("none", "missing"):
        return True
    return any(m in st.stderr.lower() for m in TRUNCATED_MARKERS)


def write_error(st: chain.HopStatus) -> str:
    detail = st.stderr or f"relay exit {st.rc}"
    if "no space left on device" in detail.lower():
        return f"disk full writing DEST (No space left on device): {detail}"
    return f"writing DEST failed: {detail}"


def chain_transfer(run: CopyRun, node_plans: dict[str, plan.NodePlan], live: list[Node], result: CopyResult,
                   replan: Replan) -> None:
    """Chain passes: the first sends what anyone lacks; repairs re-plan the cut-off nodes."""
    for node in live:
        run.entry(node.name)
    pending = [n for n in live if node_plans[n.name].send]
    for attempt in range(REPAIR_PASSES + 1):
        if not pending:
            return
        union = plan.union_send([node_plans[n.name] for n in pending], run.manifest)
        payload = plan.payload_bytes(union, run.manifest)
        run.report(f"chain pass {attempt + 1}: {counted(len(union), 'entry', 'entries')}, {counted(payload, 'byte')} "
                   "through "
                   f"{' -> '.join(n.name for n in pending)}")
        statuses = _one_pass(run, pending, union, attempt + 1)
        result.passes += 1
        result.bytes_sent += payload
        retry = _classify(run, pending, statuses, payload, union)
        if not retry:
            return
        run.report(f"re-routing around failed node(s): {len(retry)} node(s) cut off get a repair chain")
        fresh = replan(retry)  # only the cut-off nodes, from their disks
        node_plans.update(fresh)
        pending = [n for n in retry if n.name in fresh and fresh[n.name].send]


def _classify(run: CopyRun, pending: list[Node], statuses: dict[str, chain.HopStatus | str],
              payload: int, union: list[str]) -> list[Node]:
    retry = []
    for node in pending:
        entry = run.entry(node.name)
        st = statuses.get(node.name)
        if entry.status in ("unreachable", "failed") and st is None:
            continue
        entry.bytes_received += payload
        if isinstance(st, str) or st is None:
            run.fail(node.name, st or "not reached by the chain")
        elif st.extracted_ok:
            entry.status, entry.exit_code, entry.error = "ok", 0, None
            _record_stream(run, node.name, st, union)
        elif truncated(st):
            retry.append(node)
            run.fail(node.name, f"stream cut off ({st.stderr or 'no data'})")
        else:
            run.fail(node.name, write_error(st))
    return retry


def _record_stream(run: CopyRun, name: str, st: chain.HopStatus, union: list[str]) -> None:
    """What the node checked in the stream: those files need no re-read; the ones it got wrong
    are its problems.  Counts that do not add up trust nothing (verification re-reads)."""
    run.covered.setdefault(name, set()).update(union)
    files = [p for p in union if run.manifest.entries[p]["t"] == "f"]
    bad = {path: reason for reason, path in st.bad}
    run.stream_problems[name] = [f"{reason}: {path}" for path, reason in bad.items()]
    if st.bad_count > len(bad):
        run.stream_problems[name].append(f"... and {st.bad_count - len(bad)} more the stream got wrong")
    if run.stream_algo is None or st.files != len(files) or st.verified + st.bad_count != len(files):
        return
    if st.bad_count == len(bad):
        run.streamed.setdefault(name, set()).update(p for p in files if p not in bad)


def fanout_transfer(run: CopyRun, node_plans: dict[str, plan.NodePlan], live: list[Node],
                    result: CopyResult) -> None:
    """Parallel rsync from the source node (from local: to the leader once, then out)."""
    for node in live:
        run.entry(node.name)
    targets = [n for n in live if node_plans[n.name].send]
    result.passes = 1 if targets else 0
    if not targets:
        return
    progress = None
    if run.on_progress is not None:
        progress = lambda node, done: run.on_progress(node, done, node_plans[node].send_bytes)  # noqa: E731
    src, is_dir, leader = run.src, run.manifest.is_dir, run.cluster.leader
    if run.from_local:
        staged = _stage_on_leader(run, targets, progress, result)
        if staged is None:
            return
        src, is_dir, targets = staged
    try:
        got = fanout.from_source_node(run.session, leader, targets, src, is_dir, run.dest,
                                      cipher=run.cipher, delete=False, on_bytes=progress, run_id=run.run_id)
    except BaseException:  # Ctrl-C: stop the rsyncs on the leader too
        abort(run, [leader])
        raise
    for name, r in got.items():
        entry = run.entry(name)
        entry.bytes_received += r.bytes_sent
        entry.files_sent = r.files_sent
        result.bytes_sent += r.bytes_sent
        if r.error:
            run.fail(name, r.error)
        else:
            _rsync_checked(run, name, r)


def _rsync_checked(run: CopyRun, name: str, r: fanout.RsyncResult) -> None:
    """Files rsync received were checked by rsync as written (its whole-file checksum)."""
    if run.verify:
        files = run.manifest.entries
        run.streamed.setdefault(name, set()).update(p for p in r.names if files.get(p, {}).get("t") == "f")


def _stage_on_leader(run: CopyRun, targets: list[Node], progress: chain.Progress | None,
                     result: CopyResult) -> tuple[str, bool, list[Node]] | None:
    """rsync here -> leader (DEST when the leader is a target, else a staging dir); (what to send on
    from the leader, is it a folder, the targets left), or None when staging failed."""
    leader = run.cluster.leader
    on_leader = any(n.name == leader.name for n in targets)
    stage = run.dest if on_leader else f".cache/clustertool/stage-{_stage_key(run.src)}"
    r = fanout.from_local(run.cluster.name, str(ClusterPaths(run.cluster.name).ssh_config), leader,
                          run.src, run.manifest.is_dir, stage, cipher=run.cipher, delete=run.delete,
                          on_bytes=progress if on_leader else None)
    result.bytes_sent += r.bytes_sent
    if on_leader:
        run.entry(leader.name).bytes_received += r.bytes_sent
        if not r.error:
            _rsync_checked(run, leader.name, r)
    if r.error:
        for node in targets:
            run.fail(node.name, f"staging on the leader failed: {r.error}")
        return None
    staged = stage if run.manifest.is_dir else f"{stage.rstrip('/')}/{run.src.rstrip('/').rsplit('/', 1)[-1]}"
    return staged, run.manifest.is_dir, [n for n in targets if n.name != leader.name]


def _stage_key(src: str) -> str:
    return hashlib.sha1(src.encode()).hexdigest()[:12]
