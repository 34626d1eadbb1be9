"""The driver of both transfer strategies: chain passes (with repair chains) and the rsync fan-out.

``copy`` plans and verifies; this module moves the bytes.  A chain pass streams what any node
lacks through every pending node; nodes cut off behind a dead hop are re-planned from their
own disks (``replan``, handed in by copy) and get a repair chain that skips the dead node.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from clustertool.model import Node
from clustertool.remote.group import run_on_nodes
from clustertool.state import ClusterPaths
from clustertool.transfer import chain as chains
from clustertool.transfer import fanout
from clustertool.transfer import plan as plans
from clustertool.transfer.model import CopyResult, CopyRun

TRUNCATED_MARKERS = ("unexpected eof", "unexpected end", "record size")
REPAIR_PASSES = 2

Replan = Callable[[list[Node]], dict[str, plans.NodePlan]]  # nodes -> what each lacks now


def _hops(run: CopyRun, pending: list[Node]) -> list[tuple[Node, bool]]:
    """(node, extracts?) in chain order; from local the leader is always the first hop."""
    hops = [(n, True) for n in pending]
    if run.from_local:
        leader = run.cluster.leader
        hops = [(leader, any(n.name == leader.name for n in pending))] + \
               [(n, True) for n in pending if n.name != leader.name]
    return hops


def _prepare(run: CopyRun, hops: list[tuple[Node, bool]]) -> list[tuple[Node, bool]]:
    """Write every hop's script; drop hops that cannot be reached and rewire around them."""
    while hops:
        scripts = {}
        for i, (node, extract) in enumerate(hops):
            nxt = hops[i + 1][0] if i + 1 < len(hops) else None
            next_hop = (nxt.address, chains.status_dir(run.run_id, nxt.name)) if nxt else None
            scripts[node.name] = chains.hop_script(run.dest, chains.status_dir(run.run_id, node.name),
                                                   node.name, extract, next_hop, run.cipher)
        group = run_on_nodes(run.cluster.name, [n for n, _ in hops],
                             lambda n: chains.prepare_command(chains.status_dir(run.run_id, n.name)),
                             stdin_data=lambda n: scripts[n.name].encode(), timeout=60, transport=run.transport)
        bad = {r.node: r for r in group.failed()}
        if not bad:
            return hops
        for name, r in bad.items():
            run.fail(name, r.reason)
        hops = [(n, e) for n, e in hops if n.name not in bad]
    return hops


def _head(run: CopyRun, first: Node) -> tuple[list[str], list[str] | None]:
    first_hop = (first.address, chains.status_dir(run.run_id, first.name))
    if run.from_local:
        cmd = f"bash {chains.status_dir(run.run_id, first.name)}/hop.sh"
        return run.transport.argv(run.cluster.name, first, cmd), chains.tar_create_argv(run.src_dir)
    cmd = chains.leader_source_command(run.src_dir, first_hop, run.cipher,
                                       chains.status_dir(run.run_id, "source"))
    return run.transport.argv(run.cluster.name, run.cluster.leader, cmd), None


def _one_pass(run: CopyRun, pending: list[Node], union: list[str]) -> dict[str, chains.HopStatus | str]:
    hops = _prepare(run, _hops(run, pending))
    if not hops:
        return {}
    total = plans.archive_bytes(union, run.source)
    progress = None
    if run.on_progress is not None:
        progress = lambda node, done: run.on_progress(node, min(done, total), total)  # noqa: E731
    argv, local_tar = _head(run, hops[0][0])
    try:
        streamed = chains.stream(argv, union, local_tar=local_tar, on_progress=progress)
    except BaseException:  # Ctrl-C: the hops would go on without us; stop them
        abort(run, [run.cluster.leader] + [n for n, _ in hops])
        raise
    group = run_on_nodes(run.cluster.name, [n for n, _ in hops],
                         lambda n: chains.collect_command(chains.status_dir(run.run_id, n.name)), timeout=60,
                         transport=run.transport)
    out: dict[str, chains.HopStatus | str] = {}
    for r in group.results:
        out[r.node] = chains.parse_status(r.node, r.stdout) if r.ok else r.reason
        if progress is not None and not isinstance(out[r.node], str) and out[r.node].extracted_ok:
            progress(r.node, total)  # checkpoints stop short of the end
    first = hops[0][0].name
    if streamed.returncode != 0 and streamed.stderr and first in out and not isinstance(out[first], str):
        out[first].stderr = (out[first].stderr + "; " + streamed.stderr[-300:]).strip("; ")
    return out


def abort(run: CopyRun, nodes: list[Node]) -> None:
    """Stop this run's pipelines on the nodes (best effort: an interrupt is under way)."""
    unique = list({n.name: n for n in nodes}.values())
    try:
        run_on_nodes(run.cluster.name, unique, chains.abort_command(run.run_id), timeout=20,
                     transport=run.transport)
    except Exception:
        pass


def truncated(st: chains.HopStatus) -> bool:
    """Did this hop fail only because its input stream was cut (an upstream hop died)?"""
    if st.rc in ("none", "missing"):
        return True
    return any(m in st.stderr.lower() for m in TRUNCATED_MARKERS)


def write_error(st: chains.HopStatus) -> str:
    detail = st.stderr or f"tar exit {st.rc}"
    if "no space left on device" in detail.lower():
        return f"disk full writing DEST (No space left on device): {detail}"
    return f"writing DEST failed: {detail}"


def chain_transfer(run: CopyRun, node_plans: dict[str, plans.NodePlan], live: list[Node], result: CopyResult,
                   replan: Replan) -> None:
    """Chain passes: the first sends what anyone lacks; repairs re-plan the cut-off nodes."""
    for node in live:
        run.entry(node.name)
    pending = [n for n in live if node_plans[n.name].send]
    for attempt in range(REPAIR_PASSES + 1):
        if not pending:
            return
        union = plans.union_send([node_plans[n.name] for n in pending], run.source)
        payload = plans.payload_bytes(union, run.source)
        run.report(f"chain pass {attempt + 1}: {len(union)} entries, {payload} bytes through "
                   f"{' -> '.join(n.name for n in pending)}")
        statuses = _one_pass(run, pending, union)
        result.passes += 1
        result.bytes_sent += payload
        retry = _classify(run, pending, statuses, payload)
        if not retry:
            return
        run.report(f"re-routing around failed node(s): {len(retry)} node(s) cut off get a repair chain")
        fresh = replan(retry)  # only the cut-off nodes, from their disks
        node_plans.update(fresh)
        pending = [n for n in retry if n.name in fresh and fresh[n.name].send]


def _classify(run: CopyRun, pending: list[Node], statuses: dict[str, chains.HopStatus | str],
              payload: int) -> list[Node]:
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
        elif truncated(st):
            retry.append(node)
            run.fail(node.name, f"stream cut off ({st.stderr or 'no data'})")
        else:
            run.fail(node.name, write_error(st))
    return retry


def fanout_transfer(run: CopyRun, node_plans: dict[str, plans.NodePlan], live: list[Node],
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
    src, is_dir, leader = run.src, run.source.is_dir, run.cluster.leader
    if run.from_local:
        src, is_dir, targets = _stage_on_leader(run, targets, progress, result)
        if src is None:
            return
    try:
        got = fanout.from_source_node(run.cluster.name, leader, targets, src, is_dir, run.dest,
                                      cipher=run.cipher, delete=False, on_bytes=progress, run_id=run.run_id,
                                      transport=run.transport)
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


def _stage_on_leader(run: CopyRun, targets, progress, result: CopyResult):
    """rsync here -> leader (DEST when the leader is a target, else a staging dir)."""
    leader = run.cluster.leader
    on_leader = any(n.name == leader.name for n in targets)
    stage = run.dest if on_leader else f".cache/clustertool/stage-{_stage_key(run.src)}"
    r = fanout.from_local(run.cluster.name, str(ClusterPaths(run.cluster.name).ssh_config), leader,
                          run.src, run.source.is_dir, stage, cipher=run.cipher, delete=run.delete,
                          on_bytes=progress if on_leader else None)
    result.bytes_sent += r.bytes_sent
    if on_leader:
        run.entry(leader.name).bytes_received += r.bytes_sent
    if r.error:
        for node in targets:
            run.fail(node.name, f"staging on the leader failed: {r.error}")
        return None, None, []
    staged = stage if run.source.is_dir else f"{stage.rstrip('/')}/{run.src.rstrip('/').rsplit('/', 1)[-1]}"
    return staged, run.source.is_dir, [n for n in targets if n.name != leader.name]


def _stage_key(src: str) -> str:
    return hashlib.sha1(src.encode()).hexdigest()[:12]
