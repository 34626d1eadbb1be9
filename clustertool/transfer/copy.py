"""`copy`: SRC (on the leader, or here) to DEST on the selected nodes, incremental and verified.

Steps: manifests of source and nodes -> per-node plans (what each lacks) -> small fixes
(deletes, metadata) -> transfer (pipelined chain or parallel rsync fan-out) -> hop statuses ->
repair chains for nodes cut off behind a failed hop -> verification (source manifest with
hashes against every node's) -> one result per node.  Everything comes back as data.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from clustertool import nodeset, state
from clustertool.errors import UsageError
from clustertool.model import Cluster, Node
from clustertool.transfer import chain as chains
from clustertool.transfer import manifest as mf
from clustertool.transfer import plan as plans
from clustertool.transfer import drive as run_chain
from clustertool.transfer import verify

Report = Callable[[str], None]
ProgressCb = Callable[[str, int, int], None]  # (node, bytes done, bytes expected)
AUTO_CHAIN_MIN_BYTES = 32 << 20
AUTO_CHAIN_MIN_NODES = 3
REPAIR_PASSES = 2


@dataclass
class NodeCopy:
    node: str
    status: str = "ok"             # ok | mismatch | failed | unreachable
    exit_code: int = 0
    bytes_received: int = 0        # payload bytes streamed to this node
    files_sent: int = 0
    files_checked: int = 0
    error: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class CopyResult:
    src: str
    dest: str
    source: str                     # "leader" (node name) or "local"
    strategy: str
    nodes: list[NodeCopy]
    total_bytes: int = 0            # size of the source tree
    total_files: int = 0
    bytes_sent: int = 0             # payload bytes that left the source (0 on a re-run)
    passes: int = 0                 # chain passes (1 + repairs)
    verified: bool = False
    duration: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)


def relative_remote(path: str) -> str:
    """A remote path as the node's shell would see it: '~/x' -> 'x' (ssh starts in $HOME)."""
    if path == "~":
        return "."
    if path.startswith("~/"):
        return path[2:] or "."
    if path.startswith("~"):
        raise UsageError(f"path {path!r}: '~user' paths are not supported", hint="use an absolute path")
    return path


@dataclass
class Job:
    cluster: Cluster
    src: str
    dest: str
    from_local: bool
    targets: list[Node]
    delete: bool
    cipher: str | None
    on_progress: ProgressCb | None
    report: Report
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    source: mf.Manifest | None = None
    results: dict[str, NodeCopy] = field(default_factory=dict)

    @property
    def src_dir(self) -> str:
        return self.src if self.source.is_dir else (os.path.dirname(self.src.rstrip("/")) or ".")


def _targets(cluster: Cluster, selection: str | None, from_local: bool) -> list[Node]:
    if selection is None and not from_local and len(cluster.nodes) > 1:
        selection = "members"
    nodes = nodeset.select(cluster, selection)
    if not nodes:
        raise UsageError("no nodes selected", hint="see --nodes")
    return sorted(nodes, key=lambda n: n.index)


def _load(cluster_name: str) -> Cluster:
    cluster = state.load(cluster_name)
    if cluster.status != "ready":
        raise UsageError(f"cluster {cluster.name!r} is {cluster.status}, not ready for SSH")
    return cluster


def _source_manifest(job: Job) -> mf.Manifest:
    where = "here" if job.from_local else f"on the leader ({job.cluster.leader.name})"
    if job.from_local:
        man = mf.local(job.src)
    else:
        got = mf.remote(job.cluster.name, [job.cluster.leader], job.src, timeout=600)
        man = got[job.cluster.leader.name]
        if isinstance(man, str):
            raise UsageError(f"cannot read SRC {job.src!r} {where}: {man}")
    if man.error:
        raise UsageError(f"cannot read SRC {job.src!r} {where}: {man.error}")
    if not man.exists:
        raise UsageError(f"SRC {job.src!r} does not exist {where}")
    bad = [p for p, e in man.entries.items() if e["t"] in ("?", "o")]
    if bad:
        raise UsageError(f"SRC holds entries that cannot be copied (unreadable or special files): "
                         f"{mf.summarize(bad, 5)}")
    return man


def _fail(job: Job, node: str, error: str) -> None:
    unreachable = mf.is_unreachable(error)
    job.results[node] = NodeCopy(node, "unreachable" if unreachable else "failed",
                                 255 if unreachable else 1, error=error)


def _plan(job: Job) -> dict[str, plans.NodePlan]:
    dests = mf.remote(job.cluster.name, job.targets, job.dest, timeout=600)
    out: dict[str, plans.NodePlan] = {}
    for node in job.targets:
        dest = dests[node.name]
        if isinstance(dest, str):
            _fail(job, node.name, dest)
        elif dest.exists and not dest.is_dir:
            _fail(job, node.name, f"DEST {job.dest!r} exists and is not a directory")
        else:
            out[node.name] = plans.plan_node(node.name, job.source, dest, delete=job.delete)
    _settle_hashes(job, out)
    return out


def _settle_hashes(job: Job, node_plans: dict[str, plans.NodePlan]) -> None:
    """Same size, other mtime: hash both sides, then send or only fix metadata."""
    need = {name: p.hash_check for name, p in node_plans.items() if p.hash_check}
    if not need:
        return
    every = sorted({path for paths in need.values() for path in paths})
    src_hashes = verify.source_hashes(job, every)
    nodes = [job.cluster.node(name) for name in need]
    got = mf.remote(job.cluster.name, nodes, job.dest, want_hash=lambda name: need[name])
    for name, paths in need.items():
        man = got[name]
        dest_hashes = {} if isinstance(man, str) else {p: man.entries.get(p, {}).get("h") for p in paths}
        plans.resolve_hashes(node_plans[name], src_hashes, dest_hashes, job.source)


def _apply_ops(job: Job, node_plans: dict[str, plans.NodePlan]) -> None:
    from clustertool.remote.group import run_on_nodes

    todo = {n: p for n, p in node_plans.items() if p.delete or p.touch}
    if not todo:
        return
    nodes = [job.cluster.node(n) for n in todo]
    group = run_on_nodes(
        job.cluster.name, nodes, mf.python_command(), timeout=600,
        stdin_data=lambda node: mf.program_text("ops", {
            "root": relative_remote(job.dest), "delete": todo[node.name].delete,
            "touch": todo[node.name].touch}))
    for r in group.results:
        if not r.ok:
            _fail(job, r.node, r.error or r.stderr.strip()[-300:] or f"exit {r.exit_code}")


def choose_strategy(strategy: str, n_nodes: int, payload: int) -> str:
    if strategy in ("chain", "fanout"):
        return strategy
    if strategy != "auto":
        raise UsageError(f"unknown strategy {strategy!r}", hint="auto, chain or fanout")
    return "chain" if n_nodes >= AUTO_CHAIN_MIN_NODES and payload >= AUTO_CHAIN_MIN_BYTES else "fanout"


def copy(cluster_name: str, src: str, dest: str, *, source: str = "leader", selection: str | None = None,
         strategy: str = "auto", verify_after: bool = True, delete: bool = False,
         cipher: str | None = chains.DEFAULT_CIPHER, on_progress: ProgressCb | None = None,
         report: Report = lambda m: None) -> CopyResult:
    started = time.monotonic()
    if source not in ("leader", "local"):
        raise UsageError(f"--from must be leader or local, not {source!r}")
    choose_strategy(strategy, 0, 0)  # reject an unknown strategy before touching any node
    cluster = _load(cluster_name)
    from_local = source == "local"
    src = os.path.abspath(os.path.expanduser(src)) if from_local else relative_remote(src)
    job = Job(cluster, src, relative_remote(dest), from_local, _targets(cluster, selection, from_local),
              delete, cipher, on_progress, report)
    if not from_local and src == job.dest and any(n.is_leader for n in job.targets):
        raise UsageError("SRC and DEST are the same path on the leader", hint="use --nodes members")
    timings: dict[str, float] = {}
    job.source = _source_manifest(job)
    timings["source_manifest"] = time.monotonic() - started
    node_plans = _plan(job)
    _apply_ops(job, node_plans)
    timings["plan"] = time.monotonic() - started
    live = [n for n in job.targets if n.name not in job.results]
    union = plans.union_send([node_plans[n.name] for n in live], job.source)
    payload = plans.payload_bytes(union, job.source)
    chosen = choose_strategy(strategy, len(live), payload)
    report(f"{len(job.source.entries)} entries, {job.source.total_bytes} bytes at the source; "
           f"{payload} bytes to send ({chosen}, {len(live)} node(s))")
    result = CopyResult(job.src, job.dest, "local" if from_local else cluster.leader.name, chosen, [],
                        job.source.total_bytes, job.source.file_count)
    if chosen == "chain":
        run_chain.transfer(job, node_plans, live, result)
    else:
        run_chain.fanout_transfer(job, node_plans, live, result)
    timings["transfer"] = time.monotonic() - started
    if verify_after:
        verify.verify(job, job.targets, result)
        result.verified = True
    timings["verify"] = time.monotonic() - started
    for node in job.targets:
        base = job.results.get(node.name) or NodeCopy(node.name)
        base.files_sent = base.files_sent or len([p for p in node_plans.get(node.name, plans.NodePlan("")).send
                                                  if job.source.entries[p]["t"] == "f"])
        result.nodes.append(base)
    result.timings = timings
    result.duration = time.monotonic() - started
    return result
