"""`reboot`, `clean` and `fetch`: housekeeping around jobs.

What reboot means per provider:

* local: the node's processes are all killed (its PID namespace ends, /tmp and /dev/shm
  are emptied) and its PID 1 and sshd start again; home and /scratch stay, like a disk.
* static / aws (any provider without its own reboot verb): ``reboot`` over SSH (with
  ``sudo -n`` when the user is not root), then wait until SSH answers again.

Either way the command waits for SSH and re-checks the nodes (reachable, mesh).
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time
from pathlib import Path

from clustertool.cluster import monitoring, slurmup
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.wiring import check_leader_mesh, close_masters
from clustertool.core import nodeset, state
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import GroupResult, Node
from clustertool.jobs import records, scripts
from clustertool.remote.group import run_on_nodes
from clustertool.sharedfs import mount


def reboot_line(user: str) -> str:
    cmd = "reboot" if user == "root" else "sudo -n reboot"
    return f"nohup sh -c {shlex.quote('sleep 1; ' + cmd)} >/dev/null 2>&1 &"


def _wait_ssh(session: ClusterSession, nodes: list[Node], timeout: float, down_first: bool) -> None:
    deadline = time.monotonic() + timeout
    if down_first:  # wait until each node stopped answering, so we do not see it pre-reboot
        pending = list(nodes)
        while pending and time.monotonic() < deadline:
            result = run_on_nodes(session, pending, "true", timeout=5)
            pending = [n for n, r in zip(pending, result.results) if r.ok]
            time.sleep(1)
    pending = list(nodes)
    while pending:
        result = run_on_nodes(session, pending, "true", timeout=10)
        pending = [n for n, r in zip(pending, result.results) if not r.ok]
        if pending and time.monotonic() > deadline:
            raise ToolError(f"{nodeset.fold(n.name for n in pending)} did not answer SSH within {timeout:.0f}s "
                            "after the reboot", hint="`clustertool status` / the provider console")
        if pending:
            time.sleep(1)


def reboot(session: ClusterSession, selection: str | None, *, timeout: float = 600.0) -> list[Node]:
    """Reboot the selected nodes (local: restart their processes and sshd), wait for SSH, check the mesh
    again and mount the shared filesystems (progress lines: the session's reporter)."""
    report = session.report
    with session.locked() as cluster:
        nodes = nodeset.select(cluster, selection)
        provider = session.provider
        subset = dataclasses.replace(cluster, nodes=nodes)
        slurmup.before_stop(session, nodes)  # slurmctld saves its queue first
        close_masters(subset)
        if provider.REBOOT == "restart":
            report(f"restarting {nodeset.fold(n.name for n in nodes)} (all processes end, sshd starts again)")
            provider.stop_instances(subset)
            provider.start_instances(subset)
            _wait_ssh(session, nodes, timeout, False)
        elif provider.REBOOT == "provider":
            report(f"rebooting {nodeset.fold(n.name for n in nodes)} through the {cluster.provider} provider")
            provider.reboot_instances(subset)
            _wait_ssh(session, nodes, timeout, True)
        else:
            report(f"rebooting {nodeset.fold(n.name for n in nodes)} over SSH")
            run_on_nodes(session, nodes, reboot_line(cluster.user), timeout=20)
            _wait_ssh(session, nodes, timeout, True)
        for node in nodes:
            node.state = "running"
        state.save(cluster)
        report("nodes answer SSH again; checking the leader's SSH mesh")
        check_leader_mesh(session)
        mount.mount_phase(session, cluster, report)  # every node: a rebooted leader's export serves them all
        slurmup.after_boot(session, nodes)
        for line in monitoring.restart_lines(session, "reboot"):  # the rebooted nodes' exporters ended with them
            report(line)
        return nodes


def clean(session: ClusterSession, *, logs: bool, jobs: bool, selection: str | None = None) -> GroupResult:
    """Remove logs (and with ``jobs`` whole records) of finished jobs on every node."""
    cluster = session.reload()
    all_jobs = records.refresh(session)
    keep = [j.id for j in all_jobs if j.state == "running"]
    nodes = nodeset.select(cluster, selection)
    result = run_on_nodes(session, nodes, "sh -s", timeout=60,
                          stdin_data=scripts.clean_script(keep, logs, jobs).encode())
    if jobs:
        for job in all_jobs:
            if job.id not in keep:
                records.forget(cluster.name, job.id)
    return result


def _check_path(path: str) -> str:
    if not path or "\n" in path or "\0" in path:
        raise UsageError(f"invalid path {path!r}")
    return path


def remote_path_sh(job_workdir: str | None, path: str) -> str:
    """A path on the leader as a shell word: absolute as given; relative to the job's
    working directory (its home when none was given)."""
    path = _check_path(path)
    if path.startswith("/"):
        return shlex.quote(path)
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    base = shlex.quote(job_workdir) if job_workdir else '"$HOME"'
    return f"{base}/{shlex.quote(path)}"


def s3_upload_line(src_sh: str, url: str) -> str:
    if not url.startswith("s3://") or len(url) <= 5:
        raise UsageError(f"--to {url!r}: expected s3://BUCKET/PREFIX or a local folder")
    return (f"if [ -d {src_sh} ]; then aws s3 sync {src_sh} {shlex.quote(url)}; "
            f"else aws s3 cp {src_sh} {shlex.quote(url)}; fi")


def fetch(session: ClusterSession, ref: str, path: str, dest: str | None = None) -> str:
    """Copy a job's output (file or folder) from the leader; ``s3://`` uploads from the leader."""
    cluster = session.reload()
    job = records.resolve(records.refresh(session), ref)
    leader = cluster.node(job.leader)
    src = remote_path_sh(job.workdir, path)
    if dest and dest.startswith("s3://"):
        result = run_on_nodes(session, [leader], s3_upload_line(src, dest), timeout=3600).results[0]
        if not result.ok:
            raise ToolError(f"upload from the leader failed: {result.reason}",
                            hint="the leader needs the aws CLI and credentials (an instance role on AWS)")
        return dest
    target = Path(dest or job.id)
    target.mkdir(parents=True, exist_ok=True)
    line = (f"[ -e {src} ] || {{ echo \"no such file or folder on the leader\" >&2; exit 2; }}; "
            f"tar -cf - -C \"$(dirname {src})\" \"$(basename {src})\"")
    with subprocess.Popen(session.argv(leader, line), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as ssh:
        assert ssh.stderr is not None  # PIPE
        untar = subprocess.run(["tar", "-xf", "-", "-C", str(target)], stdin=ssh.stdout,
                               capture_output=True)
        err = ssh.stderr.read().decode(errors="replace")
        ssh.wait()
    if ssh.returncode != 0 or untar.returncode != 0:
        raise ToolError(f"could not fetch {path!r} of job {job.id} from {leader.name}: "
                        f"{(err or untar.stderr.decode(errors='replace')).strip()[-300:] or 'not found'}")
    return str(target)

