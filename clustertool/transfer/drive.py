"""Driving the two transfers: chain passes (with repair chains) and the rsync fan-out."""

from __future__ import annotations

from clustertool.model import Node
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import ssh_argv
from clustertool.transfer import chain as chains
from clustertool.transfer import fanout
from clustertool.transfer import manifest as mf
from clustertool.transfer import plan as plans

TRUNCATED_MARKERS = ("unexpected eof", "unexpected end", "record size")


def _entry(job, name: str):
    from clustertool.transfer.copy import NodeCopy

    return job.results.setdefault(name, NodeCopy(name))


def _hops(job, pending: list[Node]) -> list[tuple[Node, bool]]:
    """(node, extracts?) in chain order; from local the leader is always the first hop."""
    hops = [(n, True) for n in pending]
    if job.from_local:
        leader = job.cluster.leader
        hops = [(leader, any(n.name == leader.name for n in pending))] + \
               [(n, True) for n in pending if n.name != leader.name]
    return hops


def _prepare(job, hops: list[tuple[Node, bool]]) -> list[tuple[Node, bool]]:
    """Write every hop's script; drop hops that cannot be reached and rewire around them."""
    while hops:
        scripts = {}
        for i, (node, extract) in enumerate(hops):
            nxt = hops[i + 1][0] if i + 1 < len(hops) else None
            next_hop = (nxt.address, chains.status_dir(job.run_id, nxt.name)) if nxt else None
            scripts[node.name] = chains.hop_script(job.dest, chains.status_dir(job.run_id, node.name),
                                                   node.name, extract, next_hop, job.cipher)
        group = run_on_nodes(job.cluster.name, [n for n, _ in hops],
                             lambda n: chains.prepare_command(chains.status_dir(job.run_id, n.name)),
                             stdin_data=lambda n: scripts[n.name].encode(), timeout=60)
        bad = {r.node: r for r in group.results if not r.ok}
        if not bad:
            return hops
        for name, r in bad.items():
            job.results[name] = _entry(job, name)
            mark_failed(job, name, r.error or r.stderr.strip()[-300:] or f"exit {r.exit_code}")
        hops = [(n, e) for n, e in hops if n.name not in bad]
    return hops


def mark_failed(job, name: str, error: str) -> None:
    entry = _entry(job, name)
    unreachable = mf.is_unreachable(error)
    entry.status = "unreachable" if unreachable else "failed"
    entry.exit_code = 255 if unreachable else 1
    entry.error = error


def _head(job, first: Node) -> tuple[list[str], list[str] | None]:
    first_hop = (first.address, chains.status_dir(job.run_id, first.name))
    if job.from_local:
        cmd = f"bash {chains.status_dir(job.run_id, first.name)}/hop.sh"
        return ssh_argv(job.cluster.name, first, cmd), chains.tar_create_argv(job.src_dir)
    cmd = chains.leader_source_command(job.src_dir, first_hop, job.cipher,
                                       chains.status_dir(job.run_id, "source"))
    return ssh_argv(job.cluster.name, job.cluster.leader, cmd), None


def _one_pass(job, pending: list[Node], union: list[str]) -> dict[str, chains.HopStatus | str]:
    hops = _prepare(job, _hops(job, pending))
    if not hops:
        return {}
    total = plans.archive_bytes(union, job.source)
    progress = None
    if job.on_progress is not None:
        progress = lambda node, done: job.on_progress(node, min(done, total), total)  # noqa: E731
    argv, local_tar = _head(job, hops[0][0])
    try:
        run = chains.stream(argv, union, local_tar=local_tar, on_progress=progress)
    except BaseException:  # Ctrl-C: the hops would go on without us; stop them
        abort(job, [job.cluster.leader] + [n for n, _ in hops])
        raise
    group = run_on_nodes(job.cluster.name, [n for n, _ in hops],
                         lambda n: chains.collect_command(chains.status_dir(job.run_id, n.name)), timeout=60)
    out: dict[str, chains.HopStatus | str] = {}
    for r in group.results:
        out[r.node] = chains.parse_status(r.node, r.stdout) if r.ok else (r.error or f"exit {r.exit_code}")
        if progress is not None and not isinstance(out[r.node], str) and out[r.node].extracted_ok:
            progress(r.node, total)  # checkpoints stop short of the end
    if run.returncode != 0 and run.stderr and hops[0][0].name in out and not isinstance(out[hops[0][0].name], str):
        out[hops[0][0].name].stderr = (out[hops[0][0].name].stderr + "; " + run.stderr[-300:]).strip("; ")
    return out


def abort(job, nodes: list[Node]) -> None:
    """Stop this run's pipelines on the nodes (best effort: an interrupt is under way)."""
    unique = list({n.name: n for n in nodes}.values())
    try:
        run_on_nodes(job.cluster.name, unique, chains.abort_command(job.run_id), timeout=20)
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


def transfer(job, node_plans: dict[str, plans.NodePlan], live: list[Node], result) -> None:
    """Chain passes: the first sends what anyone lacks; repairs re-plan the cut-off nodes."""
    from clustertool.transfer.copy import REPAIR_PASSES, _plan

    for node in live:
        _entry(job, node.name)
    pending = [n for n in live if node_plans[n.name].send]
    for attempt in range(REPAIR_PASSES + 1):
        if not pending:
            return
        union = plans.union_send([node_plans[n.name] for n in pending], job.source)
        payload = plans.payload_bytes(union, job.source)
        job.report(f"chain pass {attempt + 1}: {len(union)} entries, {payload} bytes through "
                   f"{' -> '.join(n.name for n in pending)}")
        statuses = _one_pass(job, pending, union)
        result.passes += 1
        result.bytes_sent += payload
        retry = _classify(job, pending, statuses, node_plans, payload)
        if not retry:
            return
        job.report(f"re-routing around failed node(s): {len(retry)} node(s) cut off get a repair chain")
        saved, job.targets = job.targets, retry
        fresh = _plan(job)  # re-plan only the cut-off nodes, from their disks
        job.targets = saved
        node_plans.update(fresh)
        pending = [n for n in retry if n.name in fresh and fresh[n.name].send]


def _classify(job, pending, statuses, node_plans, payload) -> list[Node]:
    retry = []
    for node in pending:
        entry = _entry(job, node.name)
        st = statuses.get(node.name)
        if entry.status in ("unreachable", "failed") and st is None:
            continue
        entry.bytes_received += payload
        if isinstance(st, str) or st is None:
            mark_failed(job, node.name, st or "not reached by the chain")
        elif st.extracted_ok:
            entry.status, entry.exit_code, entry.error = "ok", 0, None
        elif truncated(st):
            retry.append(node)
            mark_failed(job, node.name, f"stream cut off ({st.stderr or 'no data'})")
        else:
            mark_failed(job, node.name, write_error(st))
    return retry


def fanout_transfer(job, node_plans: dict[str, plans.NodePlan], live: list[Node], result) -> None:
    """Parallel rsync from the source node (from local: to the leader once, then out)."""
    for node in live:
        _entry(job, node.name)
    targets = [n for n in live if node_plans[n.name].send]
    result.passes = 1 if targets else 0
    if not targets:
        return
    progress = None
    if job.on_progress is not None:
        progress = lambda node, done: job.on_progress(node, done, node_plans[node].send_bytes)  # noqa: E731
    src, is_dir, leader = job.src, job.source.is_dir, job.cluster.leader
    if job.from_local:
        src, is_dir, targets = _stage_on_leader(job, targets, progress, result)
        if src is None:
            return
    try:
        got = fanout.from_source_node(job.cluster.name, leader, targets, src, is_dir, job.dest,
                                      cipher=job.cipher, delete=False, on_bytes=progress, run_id=job.run_id)
    except BaseException:  # Ctrl-C: stop the rsyncs on the leader too
        abort(job, [leader])
        raise
    for name, r in got.items():
        entry = _entry(job, name)
        entry.bytes_received += r.bytes_sent
        entry.files_sent = r.files_sent
        result.bytes_sent += r.bytes_sent
        if r.error:
            mark_failed(job, name, r.error)


def _stage_on_leader(job, targets, progress, result):
    """rsync here -> leader (DEST when the leader is a target, else a staging dir)."""
    from clustertool.state import ClusterPaths

    leader = job.cluster.leader
    on_leader = any(n.name == leader.name for n in targets)
    stage = job.dest if on_leader else f".cache/clustertool/stage-{_stage_key(job.src)}"
    r = fanout.from_local(job.cluster.name, str(ClusterPaths(job.cluster.name).ssh_config), leader,
                          job.src, job.source.is_dir, stage, cipher=job.cipher, delete=job.delete,
                          on_bytes=progress if on_leader else None)
    result.bytes_sent += r.bytes_sent
    if on_leader:
        _entry(job, leader.name).bytes_received += r.bytes_sent
    if r.error:
        for node in targets:
            mark_failed(job, node.name, f"staging on the leader failed: {r.error}")
        return None, None, []
    staged = stage if job.source.is_dir else f"{stage.rstrip('/')}/{job.src.rstrip('/').rsplit('/', 1)[-1]}"
    return staged, job.source.is_dir, [n for n in targets if n.name != leader.name]


def _stage_key(src: str) -> str:
    import hashlib

    return hashlib.sha1(src.encode()).hexdigest()[:12]
