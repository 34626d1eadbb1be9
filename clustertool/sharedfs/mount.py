"""The mount phase: every shared filesystem on every node, at `up`, `start`, after `reboot`, and
`repair-mounts`; unmounted at `stop` and before `down` takes the nodes.

Provider-independent: each kind's command comes from ``argv`` (``argv.mount_command``), and this
module wraps it in one idempotent shell script per node: a filesystem already mounted and
answering is left alone; a dead one (a FUSE mount whose server went away) is lazily unmounted
and mounted again; an fstab line is added once where the kind gives one (EFS, Lustre), so the
node's own boot mounts it. The local sshfs stand-in has no fstab line: the tool mounts it again
at `start` and after `reboot`.

Each node answers one line per filesystem, ``ct-fs STATE MOUNT [DETAIL]``, parsed into
``NodeMount`` values: a node's failure is a value (the caller decides whether it stops).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Iterable

from clustertool.core.errors import RemoteError, UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent
from clustertool.core.nodeset import fold
from clustertool.providers.base import Provider, ProvisionRequest
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import Link
from clustertool.sharedfs import argv
from clustertool.sharedfs.specs import describe

MOUNT_TIMEOUT = 60.0
PROBE_TIMEOUT = 30.0
UNMOUNT_TIMEOUT = 20.0
REPAIR_HINT = "run `clustertool repair-mounts` (or `clustertool reboot --nodes NODE`)"


@dataclass(frozen=True)
class NodeMount:
    """One filesystem on one node: ``state`` mounted | already | missing | stale | unmounted | fail | unreachable."""

    node: str
    mount: str
    state: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state in ("mounted", "already", "unmounted", "absent")


# ---- what the cluster has -----------------------------------------------------------------------

def wanted(cluster: ClusterRecord) -> list[dict[str, Any]]:
    """What the user asked for at `up` (``options["shared_fs"]``)."""
    return list(cluster.options.get("shared_fs") or [])


def filesystems(cluster: ClusterRecord) -> list[dict[str, Any]]:
    """What the provider made or attached (``provider_state["shared_fs"]``)."""
    return list(cluster.provider_state.get("shared_fs") or [])


def fs_nodes(cluster: ClusterRecord, names: Iterable[str] | None = None) -> list[Node]:
    """The nodes a shared filesystem is mounted on: every node but reduction servers (no ranks)."""
    chosen = set(names) if names is not None else None
    return [n for n in cluster.ordered_nodes() if not n.is_server and (chosen is None or n.name in chosen)]


def check_kinds(provider: Provider, cluster: ClusterRecord) -> None:
    """Refuse, before anything is made, a kind the provider cannot make or attach."""
    for fs in wanted(cluster):
        if fs["kind"] not in provider.SHARED_FS_KINDS:
            offered = ", ".join(provider.SHARED_FS_KINDS) or "none"
            raise UsageError(f"--shared-fs {describe(fs)}: the {provider.name} provider has no shared filesystem "
                             f"of kind {fs['kind']!r} (it offers: {offered})",
                             hint="local clusters: --shared-fs local; aws: --shared-fs efs or fsx")


def plan_lines(cluster: ClusterRecord) -> list[str]:
    return [f"shared filesystem {describe(fs)}: made or attached at up, mounted on every node at "
            f"{fs['mount']} (again at start and after reboot), unmounted at stop and down" for fs in wanted(cluster)]


def provide(provider: Provider, request: ProvisionRequest) -> None:
    """Right after run_instances: the provider makes or attaches each wanted filesystem."""
    if wanted(request.cluster):
        request.report("making the shared filesystem(s): " + ", ".join(describe(f) for f in wanted(request.cluster)))
        provider.shared_fs(request)
        request.save()


# ---- scripts (pure) --------------------------------------------------------------------------

def _sudo(cluster: ClusterRecord) -> str:
    return "" if cluster.user == "root" else "sudo -n "


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


_FUNCS = """\
ct_mounted() { awk -v m="$1" '$2==m{f=1} END{exit !f}' /proc/self/mounts; }
ct_alive() { timeout 10 stat -t "$1" >/dev/null 2>&1; }
ct_say() { printf 'ct-fs %s %s %s\\n' "$1" "$2" "$(printf %s "$3" | tr '\\n' ' ' | tail -c 200)"; }
"""


def target_for(cluster: ClusterRecord, node: Node, fs: dict[str, Any]) -> argv.MountTarget:
    leader = cluster.leader
    return argv.MountTarget(fs=fs, cluster=cluster.name, node=node.name, is_leader=node.name == leader.name,
                              leader_address=leader.address, user=cluster.user)


def mount_script(cluster: ClusterRecord, node: Node, entries: list[dict[str, Any]]) -> str:
    """One node's script: mount each filesystem unless it is mounted and answering."""
    sudo = _sudo(cluster)
    lines = [_FUNCS]
    for fs in entries:
        cmd = argv.mount_command(target_for(cluster, node, fs))
        m = shlex.quote(fs["mount"])
        before = "".join(f"{sudo}{_q(b)} && " for b in cmd.before)
        fstab = ""
        if cmd.fstab:
            line = shlex.quote(cmd.fstab)
            fstab = (f"grep -qxF {line} /etc/fstab 2>/dev/null || "
                     f"printf '%s\\n' {line} | {sudo}tee -a /etc/fstab >/dev/null; ")
        lines.append(  # the fstab line only once a mount worked: a node that cannot mount it boots without it
            f"if ct_mounted {m} && ct_alive {m}; then ct_say already {m}; else\n"
            f"  if ct_mounted {m}; then {sudo}umount -l {m} 2>/dev/null; fi\n"
            f"  if err=$({before}{sudo}mkdir -p {m} && {sudo}{_q(cmd.argv)} 2>&1) && ct_alive {m}; "
            f"then {fstab}ct_say mounted {m}; else ct_say fail {m} \"${{err:-mounted but not answering}}\"; fi\n"
            f"fi")
    return "\n".join(lines) + "\n"


def probe_script(entries: list[dict[str, Any]]) -> str:
    """Each filesystem's state on a node: mounted (and answering), stale (mounted, not answering), missing."""
    lines = [_FUNCS]
    for fs in entries:
        m = shlex.quote(fs["mount"])
        lines.append(f"if ct_mounted {m}; then if ct_alive {m}; then ct_say mounted {m} "
                     f"\"$(awk -v m={m} '$2==m{{t=$3}} END{{print t}}' /proc/self/mounts)\"; "
                     f"else ct_say stale {m} 'mounted, not answering'; fi; else ct_say missing {m}; fi")
    return "\n".join(lines) + "\n"


def unmount_script(cluster: ClusterRecord, entries: list[dict[str, Any]]) -> str:
    sudo = _sudo(cluster)
    lines = [_FUNCS]
    for fs in entries:
        m = shlex.quote(fs["mount"])
        lines.append(f"if ct_mounted {m}; then if err=$({sudo}umount {m} 2>&1 || {sudo}umount -l {m} 2>&1); "
                     f"then ct_say unmounted {m}; else ct_say fail {m} \"$err\"; fi; else ct_say absent {m}; fi")
    return "\n".join(lines) + "\n"


def parse(node: str, output: str) -> list[NodeMount]:
    out = []
    for line in output.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "ct-fs":
            out.append(NodeMount(node, parts[2], parts[1], (parts[3] if len(parts) > 3 else "").strip()))
    return out


# ---- running them --------------------------------------------------------------------------

def _run(link: Link, cluster: ClusterRecord, nodes: list[Node], script_for, timeout: float) -> list[NodeMount]:
    entries = filesystems(cluster)
    if not entries or not nodes:
        return []
    result = run_on_nodes(link, nodes, "sh -s", timeout=timeout, stdin_data=lambda n: script_for(n).encode())
    found: list[NodeMount] = []
    for res in result.results:
        got = parse(res.node, res.stdout)
        seen = {g.mount for g in got}
        found += got
        why = res.reason if not res.ok else "no answer"
        found += [NodeMount(res.node, fs["mount"], "unreachable" if res.error else "fail", why)
                  for fs in entries if fs["mount"] not in seen]
    return found


def mount_all(link: Link, cluster: ClusterRecord, names: Iterable[str] | None = None) -> list[NodeMount]:
    """Mount every filesystem on the chosen nodes (default all); already-mounted ones are left as they are."""
    entries = filesystems(cluster)
    return _run(link, cluster, fs_nodes(cluster, names), lambda n: mount_script(cluster, n, entries), MOUNT_TIMEOUT)


def probe(link: Link, cluster: ClusterRecord, names: Iterable[str] | None = None) -> list[NodeMount]:
    entries = filesystems(cluster)
    return _run(link, cluster, fs_nodes(cluster, names), lambda n: probe_script(entries), PROBE_TIMEOUT)


def unmount_all(link: Link, cluster: ClusterRecord, names: Iterable[str] | None = None) -> list[NodeMount]:
    """Unmount every filesystem on the chosen nodes (members before the leader: its export serves theirs)."""
    entries = filesystems(cluster)
    nodes = fs_nodes(cluster, names)
    members = [n for n in nodes if not n.is_leader]
    leaders = [n for n in nodes if n.is_leader]
    script = unmount_script(cluster, entries)
    return (_run(link, cluster, members, lambda n: script, UNMOUNT_TIMEOUT)
            + _run(link, cluster, leaders, lambda n: script, UNMOUNT_TIMEOUT))


def summary(results: list[NodeMount], verb: str) -> list[str]:
    """One line per (mount, state): ``/shared: mounted on node-[1-4]``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        groups.setdefault((r.mount, r.state if r.ok else "failed"), []).append(r.node)
    words = {"mounted": f"{verb} on", "already": "already mounted on", "unmounted": "unmounted on",
             "absent": "not mounted on", "failed": "FAILED on"}
    return [f"{mount}: {words.get(st, st)} {fold(nodes)}" for (mount, st), nodes in groups.items()]


def raise_on_failures(results: list[NodeMount], what: str) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        detail = "; ".join(f"{r.node} {r.mount}: {r.detail or r.state}" for r in bad[:4])
        raise RemoteError(f"{what}: {len(bad)} shared mount(s) failed: {detail}", hint=REPAIR_HINT)


def mount_phase(link: Link, cluster: ClusterRecord, report: Reporter = silent,
                names: Iterable[str] | None = None) -> list[NodeMount]:
    """`up` / `start` / after `reboot`: mount, report one line per mount, raise when a node failed."""
    if not filesystems(cluster):
        return []
    results = mount_all(link, cluster, names)
    for line in summary(results, "mounted"):
        report(line)
    raise_on_failures(results, "mounting the shared filesystem")
    return results


def unmount_phase(link: Link, cluster: ClusterRecord, report: Reporter = silent) -> list[str]:
    """`stop` / before `down`: unmount everywhere, best effort (a node already gone has nothing mounted)."""
    if not filesystems(cluster) or not cluster.nodes:
        return []
    lines = summary(unmount_all(link, cluster), "unmounted")
    for line in lines:
        report(line)
    return lines


# ---- status -------------------------------------------------------------------------------------

def status_extra(link: Link, cluster: ClusterRecord, check: bool) -> dict[str, Any]:
    """``{"shared_fs": [...]}`` for `status`: each filesystem, where it comes from, its state per node
    (mounted / missing / stale / unreachable; "unchecked" with --no-check or when not running)."""
    entries = filesystems(cluster)
    if not entries:
        return {}
    states: dict[tuple[str, str], str] = {}
    if check and cluster.status == "ready":
        states = {(r.node, r.mount): r.state for r in probe(link, cluster)}
    rows = []
    for fs in entries:
        nodes = {n.name: states.get((n.name, fs["mount"]), "unchecked") for n in fs_nodes(cluster)}
        rows.append({"mount": fs["mount"], "kind": fs["kind"], "id": fs.get("id"), "made": fs.get("made"),
                     "source": fs.get("source") or fs.get("dns"), "nodes": nodes})
    return {"shared_fs": rows}


def status_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    """``shared /shared: local, from node-1:/scratch/...; mounted on node-[1-4]``: one line per filesystem."""
    lines = []
    for row in rows or []:
        by_state: dict[str, list[str]] = {}
        for node, st in row["nodes"].items():
            by_state.setdefault(st, []).append(node)
        where = "; ".join(f"{st if st in ('mounted', 'unchecked') else st.upper()} on {fold(nodes)}"
                          for st, nodes in sorted(by_state.items(), key=lambda kv: kv[0] != "mounted"))
        what = row["kind"] + (f" {row['id']}" if row.get("id") else "") + (
            " (attached, kept at down)" if row.get("made") is False else "")
        lines.append(f"shared {row['mount']}: {what}; {where}")
    return lines


def repair(link: Link, cluster: ClusterRecord, names: Iterable[str] | None = None) -> list[NodeMount]:
    """`repair-mounts`: mount each shared filesystem where it is missing or dead; the rest are left alone."""
    if not filesystems(cluster):
        raise UsageError(f"cluster {cluster.name!r} has no shared filesystem",
                         hint="bring one up with `clustertool up --shared-fs local` (or efs / fsx on aws)")
    return mount_all(link, cluster, names)


# ---- writing data once ----------------------------------------------------------------------------

def mount_under(cluster: ClusterRecord, path: str) -> str | None:
    """The shared mount ``path`` lies on (an absolute path at or under it), or None."""
    if not path.startswith("/"):
        return None
    clean = "/" + "/".join(p for p in path.split("/") if p and p != ".")
    for fs in filesystems(cluster):
        if clean == fs["mount"] or clean.startswith(fs["mount"].rstrip("/") + "/"):
            return str(fs["mount"])
    return None


def write_once_line(cluster: ClusterRecord, dest: str, shared: str) -> str:
    return (f"{dest} is on the shared filesystem {shared}: written once, from the leader "
            f"({cluster.leader.name}), not once per node; every node sees it there")
