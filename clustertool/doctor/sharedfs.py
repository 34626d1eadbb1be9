"""`doctor --check shared-fs`: every shared filesystem is mounted on every node, is the same
filesystem everywhere, is writable, and how long a small write and read take.

Three rounds over SSH: every node says whether each mount is there and answering; one node
(the leader, else the first that has it) writes a marker with a fresh token; every node that
has it reads the marker back (a node that cannot see it mounts something else: a local
folder, another filesystem), writes, reads and removes a small file of its own, timing both.
The writer removes the marker. A missing or dead mount is an error whose fix is
`clustertool repair-mounts` (also what `doctor --fix` runs).
"""

from __future__ import annotations

import secrets
import shlex
import statistics
from typing import Any

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import Node
from clustertool.doctor.findings import CheckResult, Finding
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.sharedfs import mount

CHECK = "shared-fs"
SAMPLE_KIB = 64


def marker_name(token: str) -> str:
    return f".clustertool-doctor-{token}"


def rw_script(mounts: list[str], token: str) -> str:
    """Per mount: does the marker hold the token; write, read and remove SAMPLE_KIB of our own (ms)."""
    lines = ["now() { date +%s%N; }"]
    for m in mounts:
        mq, marker = shlex.quote(m), shlex.quote(f"{m}/{marker_name(token)}")
        own = shlex.quote(f"{m}/{marker_name(token)}.") + '"$(hostname)"'
        lines.append(
            f"same=no; [ \"$(cat {marker} 2>/dev/null)\" = {shlex.quote(token)} ] && same=yes; "
            f"t0=$(now); if head -c {SAMPLE_KIB * 1024} /dev/zero > {own} 2>/dev/null && sync {own} 2>/dev/null; "
            f"then t1=$(now); cat {own} >/dev/null; t2=$(now); rm -f {own}; "
            f"echo ct-fsd {mq} $same yes $(( (t1 - t0) / 1000 )) $(( (t2 - t1) / 1000 )); "
            f"else rm -f {own} 2>/dev/null; echo ct-fsd {mq} $same no 0 0; fi")
    return "\n".join(lines) + "\n"


def parse_rw(node: str, output: str) -> list[dict[str, Any]]:
    out = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "ct-fsd":
            out.append({"node": node, "mount": parts[1], "same": parts[2] == "yes", "writable": parts[3] == "yes",
                        "write_ms": int(parts[4]) / 1000, "read_ms": int(parts[5]) / 1000})
    return out


def _missing(session: ClusterSession, reachable: list[Node]) -> tuple[list[Finding], dict[str, list[Node]]]:
    """Findings for mounts not there; per mount, the nodes that have it."""
    cluster = session.record
    names = {n.name for n in reachable}
    findings, have = [], {}
    states = mount.probe(session, cluster, names)
    for fs in mount.filesystems(cluster):
        have[fs["mount"]] = [n for n in mount.fs_nodes(cluster, names)
                             if any(s.node == n.name and s.mount == fs["mount"] and s.state == "mounted"
                                    for s in states)]
    for s in states:
        if s.state != "mounted":
            what = {"missing": "is not mounted", "stale": "is mounted but does not answer"}.get(s.state, s.state)
            findings.append(Finding(CHECK, s.node, "error", f"shared filesystem {s.mount} {what}"
                                    + (f" ({s.detail})" if s.detail and s.state not in ("missing", "stale") else ""),
                                    fix=f"`clustertool repair-mounts -c {cluster.name}` (or `clustertool reboot "
                                        f"--nodes {s.node}`)", fixable=True, data={"mount": s.mount}))
    return findings, have


def shared_fs_check(session: ClusterSession, reachable: list[Node]) -> CheckResult:
    cluster = session.record
    if not mount.filesystems(cluster):
        return CheckResult(CHECK, skipped="no shared filesystem")
    findings, have = _missing(session, reachable)
    token = secrets.token_hex(8)
    writers = {m: nodes[0] for m, nodes in have.items() if nodes}
    for m, node in writers.items():
        marker = shlex.quote(f"{m}/{marker_name(token)}")
        run_on_node(session, node, f"printf %s {shlex.quote(token)} > {marker} && sync {marker}", timeout=30)
    results: list[dict[str, Any]] = []
    try:
        mounted_nodes = {n.name: n for nodes in have.values() for n in nodes}
        by_node = {name: [m for m, nodes in have.items() if any(x.name == name for x in nodes)]
                   for name in mounted_nodes}
        rw = run_on_nodes(session, list(mounted_nodes.values()), "sh -s", timeout=60,
                          stdin_data=lambda n: rw_script(by_node[n.name], token).encode())
        for r in rw.results:
            results += parse_rw(r.node, r.stdout)
    finally:
        for m, node in writers.items():
            run_on_node(session, node, f"rm -f {shlex.quote(f'{m}/{marker_name(token)}')}", timeout=30)
    findings += _rw_findings(results, writers)
    return CheckResult(CHECK, findings, data={"nodes": results, "summary": _summary(results)})


def _rw_findings(results: list[dict[str, Any]], writers: dict[str, Node]) -> list[Finding]:
    out = []
    for r in results:
        if not r["same"]:
            out.append(Finding(CHECK, r["node"], "error",
                               f"{r['mount']} is not the same filesystem as on {writers[r['mount']].name}: "
                               f"the marker {writers[r['mount']].name} wrote is not there",
                               fix=f"unmount what is there (`clustertool exec -n {r['node']} -- umount "
                                   f"{r['mount']}`), then `clustertool repair-mounts`",
                               data={"mount": r["mount"]}))
        if not r["writable"]:
            out.append(Finding(CHECK, r["node"], "error", f"{r['mount']} is not writable",
                               fix="check the filesystem's permissions and free space", data={"mount": r["mount"]}))
    return out


def _summary(results: list[dict[str, Any]]) -> str:
    """``/shared: 64 KiB write 2.1 ms, read 0.8 ms (median of 4 nodes; slowest node-3 5.0 ms)``."""
    parts = []
    for m in dict.fromkeys(r["mount"] for r in results):
        rows = [r for r in results if r["mount"] == m and r["writable"]]
        if not rows:
            continue
        slowest = max(rows, key=lambda r: r["write_ms"] + r["read_ms"])
        parts.append(f"{m}: {SAMPLE_KIB} KiB write {statistics.median(r['write_ms'] for r in rows):.1f} ms, "
                     f"read {statistics.median(r['read_ms'] for r in rows):.1f} ms (median of {len(rows)} "
                     f"node(s); slowest {slowest['node']} {slowest['write_ms'] + slowest['read_ms']:.1f} ms)")
    return "; ".join(parts)
