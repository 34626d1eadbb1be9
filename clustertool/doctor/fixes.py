"""`doctor --fix`: only the safe fixes.

* strays: ``kill -9`` each stray pid, only if it still has the same command name;
* disk: remove the logs of finished jobs on that node (never a running job's);
* ssh-mesh with a host-key problem: push the cluster key, pinned known_hosts and ssh config
  to every node again (what `up` did);
* shared-fs missing on a node: mount it again (what `clustertool repair-mounts` does).
"""

from __future__ import annotations

import shlex

from clustertool.cluster import wiring
from clustertool.cluster.session import ClusterSession
from clustertool.doctor.findings import Finding
from clustertool.jobs import scripts
from clustertool.jobs.records import running_job_ids
from clustertool.remote.group import run_on_node
from clustertool.sharedfs import mount


def kill_pids_line(comms: dict[str, str]) -> str:
    """Kill each pid only if /proc/PID/comm is still what doctor saw (pids get reused)."""
    parts = [f'[ "$(cat /proc/{int(pid)}/comm 2>/dev/null)" = {shlex.quote(comm)} ] && kill -9 {int(pid)}'
             for pid, comm in comms.items()]
    return "; ".join(parts + ["true"])


def apply_fixes(session: ClusterSession, findings: list[Finding]) -> list[str]:
    cluster, report = session.record, session.report
    done: list[str] = []
    running = None
    for f in findings:
        if not f.fixable or not f.node:
            continue
        node = cluster.node(f.node) if f.node in {n.name for n in cluster.nodes} else None
        if f.check == "strays" and node:
            r = run_on_node(session, node, kill_pids_line(f.data["comms"]), timeout=30)
            if r.ok:
                done.append(f"{f.node}: killed {len(f.data['comms'])} stray process(es)")
        elif f.check == "disk" and node:
            if running is None:
                running = sorted(running_job_ids(session))
            r = run_on_node(session, node, "sh -s", timeout=60,
                            stdin_data=scripts.clean_script(running, logs=True, records=False).encode())
            removed = [line for line in r.stdout.splitlines() if line.startswith("removed ")]
            if removed:
                done.append(f"{f.node}: removed the logs of {len(removed)} finished job(s)")
    if any(f.check == "shared-fs" and f.fixable for f in findings):
        report("mounting the shared filesystem(s) again where missing")
        results = mount.mount_all(session, cluster)
        done += [f"shared-fs: {line}" for line in mount.summary(results, "mounted")]
    if any(f.check == "ssh-mesh" and f.fixable for f in findings):
        report("pushing keys and known_hosts to every node again")
        wiring.wire(session)
        done.append("pushed the cluster key, pinned known_hosts and ssh config to every node")
    for line in done:
        report(line)
    return done
