"""Build, deploy and verify the native NCCL plugin (native/), and the job environment it needs.

The build is a folder with the three artefacts (net+CollNet plugin, tuner, collnet_bench).
``deploy`` stages the same bytes on every node, checks every node's sums, and only then
moves them into place everywhere; any node that fails staging leaves the whole cluster
untouched (NCCL hangs when libnccl-net differs between nodes).  The last build and deploy of
a cluster are recorded in ``<cluster dir>/plugin.json``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import subprocess
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from clustertool import state
from clustertool.errors import MissingPrerequisite, ToolError
from clustertool.model import Cluster
from clustertool.plugin.remote import (abort_command, commit_command, leader_build_command, mismatched,
                                       parse_ld_path, parse_sums, parse_version, stage_command,
                                       status_command)

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
NET_LIB = "libnccl-net-clustertool.so"
TUNER_LIB = "libnccl-tuner-clustertool.so"
BENCH = "collnet_bench"
ARTEFACTS = (NET_LIB, TUNER_LIB, BENCH)
TUNER_TABLE = "tuner.csv"
VERSION_MARK = b"clustertool-nccl-plugin "
Report = Callable[[str], None]


@dataclass
class Build:
    dir: str
    version: str | None
    sha256: str                      # of the net library: what must match across nodes
    files: dict[str, str] = field(default_factory=dict)  # artefact -> sha256
    built_on: str = "local"


@dataclass
class NodeStatus:
    node: str
    version: str | None
    sha256: str | None
    matches: bool
    error: str | None = None


def make_argv(native_dir: Path = NATIVE_DIR) -> list[str]:
    return ["make", "-C", str(native_dir), "-j2"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_version(data: bytes) -> str | None:
    """The version string compiled into the net library (``clustertool_plugin_version``)."""
    i = data.find(VERSION_MARK)
    if i < 0:
        return None
    end = data.find(b"\0", i)
    return data[i + len(VERSION_MARK):end if end > 0 else None].decode("ascii", "replace").strip() or None


def describe(build_dir: Path, built_on: str = "local") -> Build:
    missing = [a for a in ARTEFACTS if not (build_dir / a).is_file()]
    if missing:
        raise ToolError(f"no plugin build in {build_dir} (missing {', '.join(missing)})",
                        hint="run `clustertool plugin build` first")
    files = {a: sha256_file(build_dir / a) for a in ARTEFACTS}
    version = read_version((build_dir / NET_LIB).read_bytes())
    return Build(str(build_dir), version, files[NET_LIB], files, built_on)


def build_local(native_dir: Path = NATIVE_DIR, run=subprocess.run) -> Build:
    """``make -C native``; a failure carries the tail of make's output."""
    try:
        proc = run(make_argv(native_dir), capture_output=True, text=True)
    except FileNotFoundError:
        raise MissingPrerequisite("make is not installed", hint="apt-get install build-essential") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise ToolError(f"plugin build failed (make exit {proc.returncode}):\n{tail}",
                        hint="it needs gcc, make and Open MPI's mpicc (apt-get install build-essential libopenmpi-dev)")
    return describe(native_dir / "build")


def source_tar(native_dir: Path = NATIVE_DIR) -> bytes:
    """native/ as a tar.gz, without build outputs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(native_dir.rglob("*")):
            rel = path.relative_to(native_dir)
            if rel.parts[0] == "build" or not path.is_file():
                continue
            tar.add(path, arcname=str(rel))
    return buf.getvalue()


def artefact_tar(build: Build, tuner_table: Path | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for a in ARTEFACTS:
            tar.add(Path(build.dir) / a, arcname=a)
        if tuner_table is not None:
            tar.add(tuner_table, arcname=TUNER_TABLE)
    return buf.getvalue()


def build_on_leader(cluster: Cluster, native_dir: Path = NATIVE_DIR) -> Build:
    """Compile on the leader (its compiler and libraries match the nodes) and bring the
    artefacts back into this cluster's folder, so deploy ships those exact bytes."""
    from clustertool.remote.group import run_on_node

    workdir = f"/tmp/clustertool-plugin-build-{secrets.token_hex(4)}"
    res = run_on_node(cluster.name, cluster.leader, leader_build_command(workdir, ARTEFACTS),
                      stdin_data=source_tar(native_dir), timeout=900)
    run_on_node(cluster.name, cluster.leader, f"rm -rf {workdir}", timeout=60)
    if res.exit_code != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-8:])
        raise ToolError(f"plugin build on {res.node} failed ({res.error or f'exit {res.exit_code}'}):\n{tail}",
                        hint="the leader needs gcc, make and libopenmpi-dev")
    out = state.cluster_dir(cluster.name) / "plugin-build"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(res.stdout)), mode="r:gz") as tar:
        for a in ARTEFACTS:
            member = tar.getmember(a)
            data = tar.extractfile(member).read()
            (out / a).write_bytes(data)
            os.chmod(out / a, 0o755)
    return describe(out, built_on=cluster.leader.name)


# ---- per-cluster record ----------------------------------------------------------------

def record_path(cluster_name: str) -> Path:
    return state.cluster_dir(cluster_name) / "plugin.json"


def load_record(cluster_name: str) -> dict:
    try:
        return json.loads(record_path(cluster_name).read_text())
    except (OSError, ValueError):
        return {}


def save_record(cluster_name: str, record: dict) -> None:
    path = record_path(cluster_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)


def remember_build(cluster_name: str, build: Build) -> None:
    record = load_record(cluster_name)
    record["build"] = asdict(build)
    save_record(cluster_name, record)


def current_build(cluster_name: str | None) -> Build:
    """The cluster's recorded build (e.g. from the leader), else native/build."""
    if cluster_name:
        b = load_record(cluster_name).get("build")
        if b and Path(b["dir"]).is_dir():
            return describe(Path(b["dir"]), b.get("built_on", "local"))
    return describe(NATIVE_DIR / "build")


def default_dest(cluster: Cluster) -> str:
    """/opt/clustertool/lib; local clusters share this machine's /opt, so there it is each
    node's private home instead."""
    if cluster.provider == "local":
        home = "/root" if cluster.user == "root" else f"/home/{cluster.user}"
        return f"{home}/.clustertool/lib"
    return "/opt/clustertool/lib"


# ---- deploy / status -------------------------------------------------------------------

def _failures(group, check) -> list[str]:
    """'node: reason' for every node whose result fails ``check(result) -> reason|None``."""
    out = []
    for r in group.results:
        last = (r.stderr.strip().splitlines() or [""])[-1]
        reason = r.error or (f"exit {r.exit_code}: {last}" if r.exit_code != 0 else check(r))
        if reason:
            out.append(f"{r.node}: {reason}")
    return out


def deploy(cluster: Cluster, build: Build, dest: str | None = None, tuner_table: Path | None = None,
           report: Report = lambda m: None, timeout: float = 300) -> list[NodeStatus]:
    """Put the same build on every node; all nodes or none.

    1. stage: unpack into DEST/.staging-TOKEN on every node, compare sums with the build;
    2. any failure: remove the staging folders everywhere, raise naming the nodes;
    3. commit: rename into DEST on every node and compare the sums again.
    """
    from clustertool.remote.group import run_on_nodes

    dest = dest or default_dest(cluster)
    nodes = cluster.ordered_nodes()
    files = list(ARTEFACTS) + ([TUNER_TABLE] if tuner_table else [])
    expected = dict(build.files)
    if tuner_table:
        expected[TUNER_TABLE] = sha256_file(tuner_table)
    token = secrets.token_hex(4)
    report(f"staging plugin {build.version} ({build.sha256[:12]}) in {dest} on {len(nodes)} node(s)")
    staged = run_on_nodes(cluster.name, nodes, stage_command(dest, token, files),
                          stdin_data=artefact_tar(build, tuner_table), timeout=timeout)
    bad = _failures(staged, lambda r: (f"checksum differs for {', '.join(m)}"
                                       if (m := mismatched(expected, parse_sums(r.stdout), files)) else None))
    if bad:
        run_on_nodes(cluster.name, nodes, abort_command(dest, token), timeout=60)
        raise ToolError("plugin deploy stopped before changing any node: " + "; ".join(bad),
                        hint="fix the named nodes (disk space, permissions, --dest) and deploy again")
    report("all nodes staged with matching checksums; switching them over")
    done = run_on_nodes(cluster.name, nodes, commit_command(dest, token, files), timeout=timeout)
    bad = _failures(done, lambda r: (f"checksum differs for {', '.join(m)}"
                                     if (m := mismatched(expected, parse_sums(r.stdout), files)) else None))
    if bad:
        raise ToolError("plugin deploy left nodes that do not match the build: " + "; ".join(bad),
                        hint="NCCL hangs when nodes differ: run `clustertool plugin deploy` again")
    leader = next(r for r in done.results if r.node == cluster.leader.name)
    record = load_record(cluster.name)
    record["deployed"] = {"dest": dest, "sha256": build.sha256, "version": build.version,
                          "tuner_table": bool(tuner_table), "ld_library_path": parse_ld_path(leader.stdout)}
    save_record(cluster.name, record)
    return [NodeStatus(r.node, build.version, build.sha256, True) for r in done.results]


def status(cluster: Cluster, build: Build | None, dest: str | None = None,
           timeout: float = 60) -> list[NodeStatus]:
    """Per node: installed version and net-library checksum, and whether it matches ``build``."""
    from clustertool.remote.group import run_on_nodes

    dest = dest or load_record(cluster.name).get("deployed", {}).get("dest") or default_dest(cluster)
    group = run_on_nodes(cluster.name, cluster.ordered_nodes(), status_command(dest, ARTEFACTS), timeout=timeout)
    rows = []
    for r in group.results:
        if r.error or r.exit_code != 0:
            rows.append(NodeStatus(r.node, None, None, False, r.error or f"exit {r.exit_code}"))
            continue
        sums = parse_sums(r.stdout)
        sha = sums.get(NET_LIB)
        ok = build is not None and not mismatched(build.files, sums, ARTEFACTS)
        rows.append(NodeStatus(r.node, parse_version(r.stdout), sha, ok, None if sha else "not installed"))
    return rows


def plugin_env(cluster: Cluster) -> dict[str, str]:
    """The environment a job needs to run NCCL with the deployed plugin (for `run --plugin`).

    NCCL takes the plugins by absolute path, so they load whatever LD_LIBRARY_PATH holds;
    LD_LIBRARY_PATH still gets the plugin folder in front of the nodes' own value (seen at
    deploy) so the OFI plugin and CUDA stay reachable.
    """
    deployed = load_record(cluster.name).get("deployed")
    if not deployed:
        raise ToolError(f"the NCCL plugin is not deployed on cluster {cluster.name!r}",
                        hint="clustertool plugin build && clustertool plugin deploy")
    dest = deployed["dest"].rstrip("/")
    ld = ":".join(p for p in (dest, deployed.get("ld_library_path") or "") if p)
    env = {
        "NCCL_NET_PLUGIN": f"{dest}/{NET_LIB}",
        "NCCL_COLLNET_ENABLE": "1",
        "NCCL_TUNER_PLUGIN": f"{dest}/{TUNER_LIB}",
        "LD_LIBRARY_PATH": ld,
    }
    if deployed.get("tuner_table"):
        env["CLUSTERTOOL_TUNER_CONFIG"] = f"{dest}/{TUNER_TABLE}"
    return env


job_env = plugin_env
