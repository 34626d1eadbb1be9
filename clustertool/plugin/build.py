"""`plugin build`: compile the native NCCL plugin (native/) here or on the leader, and the record.

The build is a folder with the four artefacts (net+CollNet plugin, tuner, collnet_bench, clustertool-reducer).
The last build and deploy of a cluster are recorded in ``<cluster dir>/plugin.json``.
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

from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import MissingPrerequisite, ToolError
from clustertool.plugin.remote import leader_build_command
from clustertool.remote.group import run_on_node

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
NET_NAME = "clustertool"  # NCCL_NET_PLUGIN=<name> loads libnccl-net-<name>.so
NET_LIB = f"libnccl-net-{NET_NAME}.so"
TUNER_LIB = "libnccl-tuner-clustertool.so"
BENCH = "collnet_bench"
REDUCER = "clustertool-reducer"  # the reduction server (run --plugin starts one per server node)
ARTEFACTS = (NET_LIB, TUNER_LIB, BENCH, REDUCER)
TUNER_TABLE = "tuner.csv"
VERSION_MARK = b"clustertool-nccl-plugin "


@dataclass
class Build:
    dir: str
    version: str | None
    sha256: str                      # of the net library: what must match across nodes
    files: dict[str, str] = field(default_factory=dict)  # artefact -> sha256
    built_on: str = "local"


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


def build_local(native_dir: Path = NATIVE_DIR,
                run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> Build:
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



def build_on_leader(session: ClusterSession, native_dir: Path = NATIVE_DIR) -> Build:
    """Compile on the leader (its compiler and libraries match the nodes) and bring the
    artefacts back into this cluster's folder, so deploy ships those exact bytes."""
    cluster = session.record
    workdir = f"/tmp/clustertool-plugin-build-{secrets.token_hex(4)}"
    res = run_on_node(session, cluster.leader, leader_build_command(workdir, ARTEFACTS),
                      stdin_data=source_tar(native_dir), timeout=900)
    run_on_node(session, cluster.leader, f"rm -rf {workdir}", timeout=60)
    if not res.ok:
        tail = "\n".join(res.stderr.strip().splitlines()[-8:])
        raise ToolError(f"plugin build on {res.node} failed ({res.reason}):\n{tail}",
                        hint="the leader needs gcc, make and libopenmpi-dev")
    out = state.cluster_dir(cluster.name) / "plugin-build"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(res.stdout)), mode="r:gz") as tar:
        for a in ARTEFACTS:
            member = tar.getmember(a)
            fh = tar.extractfile(member)
            assert fh is not None, f"{a}: not a regular file in the build's tar"
            data = fh.read()
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
