"""`clustertool doctor`: checks that return findings (data), each with a severity and a fix.

Checks: reach (SSH from here), ssh-mesh (every node to every node, pinned keys), disk,
sameness (CPU/GPU counts, driver/CUDA/NCCL/MPI versions, plugin checksum, instance type
and AZ), strays (python/MPI processes outside running jobs), clock, mpi-smoke
(`mpirun hostname` over all slots) and links (pairwise iperf3 bandwidth vs the median).
``fix=True`` applies the safe fixes (kill strays, clear finished jobs' logs on a full disk,
push keys/known_hosts again) and runs the checks once more.
"""

from __future__ import annotations

import time
from typing import Callable

from clustertool import state
from clustertool.doctor import analyze, network
from clustertool.doctor.facts import DEFAULT_PLUGIN_PATH, NodeFacts, facts_script, parse_facts
from clustertool.doctor.model import CheckResult, Finding, Report
from clustertool.errors import UsageError
from clustertool.model import Cluster, Node
from clustertool.remote.group import run_on_nodes

Report_ = Callable[[str], None]
ALL_CHECKS = ("reach", "ssh-mesh", "disk", "sameness", "strays", "clock", "mpi-smoke", "links")


def plugin_path(cluster: Cluster) -> str:
    """Where clustertool.native deployed (or would deploy) the NCCL net plugin on the nodes."""
    try:
        from clustertool.plugin import build as native  # type: ignore[attr-defined]

        deployed = (native.load_record(cluster.name).get("deployed") or {})
        dest = deployed.get("dest") or native.default_dest(cluster)
        return f"{str(dest).rstrip('/')}/{native.NET_LIB}"
    except (ImportError, AttributeError):
        return DEFAULT_PLUGIN_PATH


def _timed(name: str, fn) -> CheckResult:
    t0 = time.monotonic()
    result = fn()
    if not isinstance(result, CheckResult):
        result = CheckResult(name, findings=list(result))
    result.seconds = time.monotonic() - t0
    return result


def _reach(cluster: Cluster) -> tuple[CheckResult, list[Node]]:
    result = run_on_nodes(cluster.name, cluster.nodes, "true", timeout=15)
    bad = {r.node: r for r in result.results if not r.ok}
    findings = [Finding("reach", name, "error", f"not reachable over SSH: {r.error or 'exit ' + str(r.exit_code)}",
                        fix=f"is the machine up and sshd running? `clustertool reboot --nodes {name}`")
                for name, r in bad.items()]
    return CheckResult("reach", findings), [n for n in cluster.nodes if n.name not in bad]


def _facts(cluster: Cluster, nodes: list[Node], plugin: str, disk_paths: list[str]) -> list[NodeFacts]:
    result = run_on_nodes(cluster.name, nodes, "sh -s", timeout=60,
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


def _clock(cluster: Cluster, nodes: list[Node]) -> CheckResult:
    offsets, slack = {}, {}
    t0 = time.time()
    result = run_on_nodes(cluster.name, nodes, "date +%s.%N", timeout=15)
    for r in result.results:
        try:
            remote = float(r.stdout.strip())
        except ValueError:
            continue
        # the node read its clock between t0 and t0 + duration (ssh is already connected)
        offsets[r.node] = remote - (t0 + r.duration / 2)
        slack[r.node] = r.duration / 2
    return CheckResult("clock", analyze.clock_findings(offsets, slack), data={"offsets_s": offsets})


def _mesh(cluster: Cluster, reachable: list[Node]) -> CheckResult:
    outputs = {}
    result = run_on_nodes(cluster.name, reachable,
                          lambda n: network.mesh_script([t for t in cluster.nodes if t.name != n.name]), timeout=60)
    for r in result.results:
        outputs[r.node] = r.stdout
    unreachable = {n.name for n in cluster.nodes} - {n.name for n in reachable}
    return CheckResult("ssh-mesh", network.mesh_findings(cluster, reachable, outputs, unreachable))


def _links(cluster: Cluster, reachable: list[Node], facts: list[NodeFacts]) -> CheckResult:
    missing = [f.node for f in facts if f.values.get("iperf3") != "yes"]
    if missing:
        return CheckResult("links", [Finding("links", n, "warning", "iperf3 is not installed: link check skipped",
                                             fix="apt-get install iperf3 (or yum install iperf3)") for n in missing])
    if len(reachable) < 2:
        return CheckResult("links", skipped="fewer than two reachable nodes")
    parallel = cluster.provider != "local"  # local nodes share this machine's CPUs: one pair at a time
    pairs, failed = network.link_check(cluster, reachable, parallel=parallel)
    slow = {f.node for f in analyze.link_findings(pairs, {}) if f.node}
    if slow:  # measure the suspects' pairs once more and keep the better figure: noise is not a finding
        again, _ = network.link_check(cluster, reachable, parallel=parallel, only=slow)
        pairs = {k: max(v, again.get(k, 0.0)) for k, v in pairs.items()}
    data = {"pairs_bits_per_s": {f"{a}<->{b}": bw for (a, b), bw in pairs.items()},
            "node_median_bits_per_s": analyze.node_scores(pairs)}
    return CheckResult("links", analyze.link_findings(pairs, failed), data=data)


def running_job_ids(cluster: Cluster) -> set[str]:
    from clustertool.jobs import records

    return {j.id for j in records.refresh(cluster) if j.state == "running"}


def diagnose(cluster: Cluster, *, checks: tuple[str, ...] = ALL_CHECKS, plugin: str | None = None,
             disk_paths: list[str] | None = None, report: Report_ = lambda m: None) -> Report:
    unknown = [c for c in checks if c not in ALL_CHECKS]
    if unknown:
        raise UsageError(f"unknown check {unknown[0]!r}", hint=f"checks: {', '.join(ALL_CHECKS)}")
    out = Report(cluster.name)
    report("reach: SSH to every node")
    reach, reachable = _reach(cluster)
    out.checks.append(reach)
    if not reachable:
        return out
    facts = _facts(cluster, reachable, plugin or plugin_path(cluster), disk_paths or ["/scratch"])
    slots = {n.name: n.slots for n in cluster.nodes}
    steps = {
        "ssh-mesh": lambda: _mesh(cluster, reachable),
        "disk": lambda: analyze.disk_findings(facts),
        "sameness": lambda: CheckResult("sameness", analyze.sameness_findings(facts, slots),
                                        data={f.node: f.values for f in facts}),
        "strays": lambda: analyze.stray_findings(facts, running_job_ids(cluster)),
        "clock": lambda: _clock(cluster, reachable),
        "mpi-smoke": lambda: (network.smoke_test(cluster) if len(reachable) == len(cluster.nodes)
                              else CheckResult("mpi-smoke", skipped="a node is unreachable")),
        "links": lambda: _links(cluster, reachable, facts),
    }
    for name, fn in steps.items():
        if name in checks:
            report(f"{name}")
            result = _timed(name, fn)
            result.name = name
            out.checks.append(result)
    return out


def run(cluster_name: str, *, fix: bool = False, checks: tuple[str, ...] = ALL_CHECKS,
        plugin: str | None = None, disk_paths: list[str] | None = None,
        report: Report_ = lambda m: None) -> Report:
    cluster = state.load(cluster_name)
    if cluster.status != "ready":
        raise UsageError(f"cluster {cluster.name!r} is {cluster.status}, not ready")
    result = diagnose(cluster, checks=checks, plugin=plugin, disk_paths=disk_paths, report=report)
    if not fix or result.clean:
        return result
    from clustertool.doctor.fixes import apply_fixes

    done = apply_fixes(cluster, result.findings, report=report)
    if not done:
        return result
    report("checking again after the fixes")
    again = diagnose(cluster, checks=checks, plugin=plugin, disk_paths=disk_paths, report=report)
    again.fixed = done
    return again
