"""`plugin deploy`, `plugin status`, `plugin env`: the same build on every node, and its job environment.

``deploy`` stages the same bytes on every node, checks every node's sums, and only then
moves them into place everywhere; any node that fails staging leaves the whole cluster
untouched (NCCL hangs when libnccl-net differs between nodes).
"""

from __future__ import annotations

import io
import secrets
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, GroupResult, HostResult
from clustertool.plugin.build import (
    ARTEFACTS,
    NET_LIB,
    NET_NAME,
    TUNER_LIB,
    TUNER_TABLE,
    Build,
    load_record,
    save_record,
    sha256_file,
)
from clustertool.plugin.remote import (
    abort_command,
    commit_command,
    mismatched,
    parse_ld_path,
    parse_sums,
    parse_version,
    stage_command,
    status_command,
)
from clustertool.remote.group import run_on_nodes


@dataclass
class PluginStatus:
    """The plugin on one node: installed version and checksum, and whether it matches the build."""

    node: str
    version: str | None
    sha256: str | None
    matches: bool
    error: str | None = None


def default_dest(cluster: ClusterRecord) -> str:
    """/opt/clustertool/lib; local clusters share this machine's /opt, so there it is each
    node's private home instead."""
    if cluster.provider == "local":
        home = "/root" if cluster.user == "root" else f"/home/{cluster.user}"
        return f"{home}/.clustertool/lib"
    return "/opt/clustertool/lib"


def artefact_tar(build: Build, tuner_table: Path | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for a in ARTEFACTS:
            tar.add(Path(build.dir) / a, arcname=a)
        if tuner_table is not None:
            tar.add(tuner_table, arcname=TUNER_TABLE)
    return buf.getvalue()


def _failures(group: GroupResult, check: Callable[[HostResult], str | None]) -> list[str]:
    """'node: reason' for every node that failed, or whose output fails ``check(result) -> reason|None``."""
    out = []
    for r in group.results:
        reason = r.reason or check(r)
        if reason:
            out.append(f"{r.node}: {reason}")
    return out


def deploy(session: ClusterSession, build: Build, dest: str | None = None, tuner_table: Path | None = None,
           timeout: float = 300) -> list[PluginStatus]:
    """Put the same build on every node; all nodes or none.

    1. stage: unpack into DEST/.staging-TOKEN on every node, compare sums with the build;
    2. any failure: remove the staging folders everywhere, raise naming the nodes;
    3. commit: rename into DEST on every node and compare the sums again.
    """
    cluster, report = session.record, session.report
    dest = dest or default_dest(cluster)
    nodes = cluster.ordered_nodes()
    files = list(ARTEFACTS) + ([TUNER_TABLE] if tuner_table else [])
    expected = dict(build.files)
    if tuner_table:
        expected[TUNER_TABLE] = sha256_file(tuner_table)
    token = secrets.token_hex(4)
    report(f"staging plugin {build.version} ({build.sha256[:12]}) in {dest} on {len(nodes)} node(s)")
    staged = run_on_nodes(session, nodes, stage_command(dest, token, files),
                          stdin_data=artefact_tar(build, tuner_table), timeout=timeout)
    bad = _failures(staged, lambda r: (f"checksum differs for {', '.join(m)}"
                                       if (m := mismatched(expected, parse_sums(r.stdout), files)) else None))
    if bad:
        run_on_nodes(session, nodes, abort_command(dest, token), timeout=60)
        raise ToolError("plugin deploy stopped before changing any node: " + "; ".join(bad),
                        hint="fix the named nodes (disk space, permissions, --dest) and deploy again")
    report("all nodes staged with matching checksums; switching them over")
    done = run_on_nodes(session, nodes, commit_command(dest, token, files), timeout=timeout)
    bad = _failures(done, lambda r: (f"checksum differs for {', '.join(m)}"
                                     if (m := mismatched(expected, parse_sums(r.stdout), files)) else None))
    if bad:
        raise ToolError("plugin deploy left nodes that do not match the build: " + "; ".join(bad),
                        hint="NCCL hangs when nodes differ: run `clustertool plugin deploy` again")
    leader = next(r for r in done.results if r.node == cluster.leader.name)
    record = load_record(cluster.name)
    record["deployed"] = {"dest": dest, "sha256": build.sha256, "version": build.version, "files": expected,
                          "tuner_table": bool(tuner_table), "ld_library_path": parse_ld_path(leader.stdout)}
    save_record(cluster.name, record)
    return [PluginStatus(r.node, build.version, build.sha256, True) for r in done.results]


def status(session: ClusterSession, build: Build | None, dest: str | None = None,
           timeout: float = 60) -> list[PluginStatus]:
    """Per node: installed version and net-library checksum, and whether it matches ``build``."""
    cluster = session.record
    dest = dest or load_record(cluster.name).get("deployed", {}).get("dest") or default_dest(cluster)
    group = run_on_nodes(session, cluster.ordered_nodes(), status_command(dest, ARTEFACTS), timeout=timeout)
    rows = []
    for r in group.results:
        if not r.ok:
            rows.append(PluginStatus(r.node, None, None, False, r.reason))
            continue
        sums = parse_sums(r.stdout)
        sha = sums.get(NET_LIB)
        ok = build is not None and not mismatched(build.files, sums, ARTEFACTS)
        rows.append(PluginStatus(r.node, parse_version(r.stdout), sha, ok, None if sha else "not installed"))
    return rows


def plugin_env(cluster: ClusterRecord) -> dict[str, str]:
    """The environment a job needs to run NCCL with the deployed plugin (for `run --plugin`).

    The net plugin goes by name: NCCL 2.19 and 2.20 only try ``libnccl-net-<NCCL_NET_PLUGIN>.so``
    (an absolute path there silently gives NCCL's own net), which LD_LIBRARY_PATH finds with the
    plugin folder in front of the nodes' own value (seen at deploy), so the OFI plugin and CUDA
    stay reachable. The tuner goes by absolute path, which every release with a tuner accepts.
    """
    deployed = load_record(cluster.name).get("deployed")
    if not deployed:
        raise ToolError(f"the NCCL plugin is not deployed on cluster {cluster.name!r}",
                        hint="clustertool plugin build && clustertool plugin deploy")
    dest = deployed["dest"].rstrip("/")
    ld = ":".join(p for p in (dest, deployed.get("ld_library_path") or "") if p)
    env = {
        "NCCL_NET_PLUGIN": NET_NAME,
        "NCCL_COLLNET_ENABLE": "1",
        "NCCL_TUNER_PLUGIN": f"{dest}/{TUNER_LIB}",
        "LD_LIBRARY_PATH": ld,
    }
    if deployed.get("tuner_table"):
        env["CLUSTERTOOL_TUNER_CONFIG"] = f"{dest}/{TUNER_TABLE}"
    return env
