"""`clustertool doctor`: checks that return findings (data), each with a severity and a fix.

Checks: reach (SSH from here), ssh-mesh (every node to every node, pinned keys), disk,
sameness (CPU/GPU counts, driver/CUDA/NCCL/MPI versions, plugin checksum, instance type
and AZ), strays (python/MPI processes outside running jobs), clock, mpi-smoke
(`mpirun hostname` over all slots), network (alias links: rounds of disjoint pairs measuring iperf3
bandwidth and round trips, which name the slow node or link in ~log2(n)+1 rounds: doctor/bisect.py) and
plugin-nccl (`plugin check`: does NCCL load the deployed plugin and run CollNet; only on GPU
clusters with the plugin deployed, skipped elsewhere), gpu (nvidia-smi, Xid events in the kernel log and,
with ``deep``, DCGM's diagnostics: doctor/gpu.py) and efa (fi_info against the EFA interfaces, and the
network NCCL used: doctor/efa.py); those two skip clusters without GPUs or EFA; shared-fs (each shared
filesystem mounted, the same and writable on every node, with a write/read time: doctor/sharedfs.py); slurm
(the controller, node states against the record, munge, GRES against the GPUs: doctor/slurmcheck.py).
``fix=True`` applies the safe fixes (kill strays, clear finished jobs' logs on a full disk,
push keys/known_hosts again) and runs the checks once more.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, cast

from clustertool.cluster.facts import NodeFacts, facts_script, gpu_count, parse_facts
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, Node
from clustertool.doctor import analyze, autocordon, hwchecks, netchecks, netprobe, sharedfs, slurmcheck, slurmhold
from clustertool.doctor.doctorrequests import DoctorRequest
from clustertool.doctor.findings import CheckResult, Diagnosis, Finding
from clustertool.doctor.fixes import apply_fixes
from clustertool.doctor.plugin_check import check
from clustertool.jobs.records import running_job_ids
from clustertool.plugin.build import NET_LIB, load_record
from clustertool.plugin.deploy import default_dest
from clustertool.remote.group import run_on_nodes
from clustertool.remote.mesh import FULL_MESH_MAX, failed_targets, mesh_peers, mesh_script

NEEDS_FACTS = ("disk", "sameness", "strays", "plugin-nccl")


def plugin_path(cluster: ClusterRecord) -> str:
    """Where `plugin deploy` put (or would put) the NCCL net plugin on the nodes."""
    dest = (load_record(cluster.name).get("deployed") or {}).get("dest") or default_dest(cluster)
    return f"{str(dest).rstrip('/')}/{NET_LIB}"


def _timed(name: str, fn: Callable[[], object]) -> CheckResult:
    t0 = time.monotonic()
    result = fn()
    if not isinstance(result, CheckResult):
        result = CheckResult(name, findings=list(cast(Iterable[Finding], result)))
    result.seconds = time.monotonic() - t0
    return result


def _reach(session: ClusterSession) -> tuple[CheckResult, list[Node]]:
    cluster = session.record
    result = run_on_nodes(session, cluster.nodes, "true", timeout=15)
    bad = {r.node: r for r in result.failed()}
    servers = {n.name for n in cluster.servers}
    findings = [Finding("reach", name, "error", f"not reachable over SSH: {r.reason}",
                        fix=f"is the machine up and sshd running? `clustertool reboot --nodes {name}`")
                if name not in servers else
                Finding("reach", name, "error", f"reduction server not reachable over SSH: {r.reason}; "
                        "`run --plugin` cannot start its reducer, so jobs with the plugin will not start",
                        fix=f"`clustertool reboot --nodes {name}` (or `clustertool stop` + `start`); until it "
                            "answers, run jobs without --plugin")
                for name, r in bad.items()]
    return CheckResult("reach", findings), [n for n in cluster.nodes if n.name not in bad]


def _facts(session: ClusterSession, nodes: list[Node], plugin: str, disk_paths: list[str]) -> list[NodeFacts]:
    result = run_on_nodes(session, nodes, "sh -s", timeout=60,
                          stdin_data=facts_script(plugin, disk_paths).encode())
    out = []
    for node, r in zip(nodes, result.results):
        if r.error:
            continue
        f = parse_facts(r.node, r.stdout)
        for key, aliases in (("instance_type", ("instance_type",)),
                             ("az", ("az", "availability_zone", "zone"))):
            for alias in aliases:
                if node.extra.get(alias):
                    f.values[key] = str(node.extra[alias])
                    break
        out.append(f)
    return out


def _clock(session: ClusterSession, nodes: list[Node]) -> CheckResult:
    offsets, slack = {}, {}
    t0 = time.time()
    result = run_on_nodes(session, nodes, "date +%s.%N", timeout=15)
    for r in result.results:
        try:
            remote = float(r.stdout.strip())
        except ValueError:
            continue
        # the node read its clock between t0 and t0 + duration (ssh is already connected)
        offsets[r.node] = remote - (t0 + r.duration / 2)
        slack[r.node] = r.duration / 2
    return CheckResult("clock", analyze.clock_findings(offsets, slack), data={"offsets_s": offsets})


def _mesh(session: ClusterSession, reachable: list[Node]) -> CheckResult:
    """From every node to its peers (all others, or a ring sample on large clusters: mesh.py)."""
    cluster = session.record
    peers = mesh_peers(cluster.nodes)
    parallel = cluster.provider != "local"  # local nodes share this machine's CPUs: one peer at a time each
    result = run_on_nodes(session, reachable, lambda node: mesh_script(peers[node.name], parallel),
                          timeout=180)
    outputs = {r.node: r.stdout for r in result.results}
    outputs = _mesh_again(session, reachable, outputs)
    unreachable = {n.name for n in cluster.nodes} - {n.name for n in reachable}
    pairs = sum(len(peers[n.name]) for n in reachable)
    data = {"pairs_tried": pairs, "sampled": len(cluster.nodes) > FULL_MESH_MAX}
    return CheckResult("ssh-mesh", netchecks.mesh_findings(cluster, reachable, outputs, unreachable, peers), data=data)


def _mesh_again(session: ClusterSession, reachable: list[Node], outputs: dict[str, str]) -> dict[str, str]:
    """Try each failed pair once more, one at a time from its source: only what fails twice stays."""
    cluster = session.record
    by_addr = {n.address: n for n in cluster.nodes}
    failed = {name: [by_addr[a] for a in failed_targets(out) if a in by_addr] for name, out in outputs.items()}
    sources = [n for n in reachable if failed.get(n.name)]
    if not sources:
        return outputs
    again = run_on_nodes(session, sources, lambda node: mesh_script(failed[node.name], parallel=False),
                         timeout=180)
    return {**outputs, **{r.node: r.stdout for r in again.results if r.ok}}


def _plugin_nccl(session: ClusterSession, reachable: list[Node], facts: list[NodeFacts]) -> CheckResult:
    """`plugin check` on GPU clusters with the plugin deployed: NCCL's own word on the plugin."""
    cluster = session.record
    gpus = {f.node: gpu_count(f) for f in facts}
    if not any(gpus.values()):
        return CheckResult("plugin-nccl", skipped="no GPU")
    if not load_record(cluster.name).get("deployed"):
        return CheckResult("plugin-nccl", skipped="plugin not deployed")
    if len(reachable) < len(cluster.nodes):
        return CheckResult("plugin-nccl", skipped="a node is unreachable")
    running = running_job_ids(session)
    if running:   # the GPUs are busy: not the moment to start NCCL on them
        return CheckResult("plugin-nccl", skipped=f"job {sorted(running)[0]} is running")
    try:
        result = check(session, gpus=gpus)
    except ToolError as exc:   # e.g. files that differ from the deploy (sameness names those too)
        return CheckResult("plugin-nccl", [Finding("plugin-nccl", None, "warning", f"plugin check could not run: "
                                                   f"{exc.message}", fix=exc.hint or "")])
    return CheckResult("plugin-nccl", analyze.nccl_findings(result))


def diagnose(session: ClusterSession, request: DoctorRequest) -> Diagnosis:
    """Every check the request names, once (progress lines: the session's reporter)."""
    cluster, report, checks = session.record, session.report, request.checks
    out = Diagnosis(cluster.name)
    report("reach: SSH to every node")
    reach, reachable = _reach(session)
    out.checks.append(reach)
    out.checks += autocordon.notes(cluster)  # cordoned nodes are checked like any other, and named as cordoned
    if not reachable:
        return out
    facts: list[NodeFacts] = []
    if any(c in checks for c in NEEDS_FACTS):  # one round on every node, only when a check reads it
        facts = _facts(session, reachable, request.plugin_path or plugin_path(cluster),
                       list(request.disk_paths) or ["/scratch"])
    slots = {n.name: n.slots for n in cluster.nodes}
    gpu_options = request.gpu_options()
    servers = {n.name for n in cluster.servers}
    steps = {
        "ssh-mesh": lambda: _mesh(session, reachable),
        "disk": lambda: analyze.disk_findings(facts),
        "sameness": lambda: CheckResult("sameness", analyze.sameness_findings(facts, slots, servers),
                                        data={f.node: f.values for f in facts}),
        "strays": lambda: analyze.stray_findings(facts, running_job_ids(session)),
        "clock": lambda: _clock(session, reachable),
        "mpi-smoke": lambda: (slurmhold.inside(session, reachable, "mpi-smoke", lambda: netchecks.smoke_test(session))
                              if len(reachable) == len(cluster.nodes)
                              else CheckResult("mpi-smoke", skipped="a node is unreachable")),
        "network": lambda: slurmhold.inside(session, reachable, "network", lambda: netprobe.network_check(
            session, reachable, threshold=request.threshold, all_pairs=request.all_pairs)),
        "plugin-nccl": lambda: _plugin_nccl(session, reachable, facts),
        "gpu": lambda: hwchecks.gpu_check(session, reachable, gpu_options,
                                          running_job_ids(session) if gpu_options.deep else set()),
        "efa": lambda: hwchecks.efa_check(session, reachable, nccl_log=request.nccl_log),
        "shared-fs": lambda: sharedfs.shared_fs_check(session, reachable),
        "slurm": lambda: slurmcheck.check(session, reachable),
    }
    for name, fn in steps.items():
        if name in checks:
            report(f"{name}")
            result = _timed(name, fn)
            result.name = name
            out.checks.append(result)
    return out


def run(session: ClusterSession, request: DoctorRequest) -> Diagnosis:
    """`clustertool doctor`: the request's checks; with ``fix``, the safe fixes and the checks once more;
    with ``cordon``, every node found at error severity cordoned (``Diagnosis.cordoned`` says what)."""
    session.ready()
    result = diagnose(session, request)
    if request.fix and not result.clean:
        done = apply_fixes(session, result.findings)
        if done:
            session.report("checking again after the fixes")
            result = diagnose(session, request)
            result.fixed = done
    if request.cordon:
        result.cordoned = autocordon.cordon_errors(session, result)
    return result
