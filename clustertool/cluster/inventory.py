"""Inventory export: a cluster for other tools (Ansible, anything reading JSON, plain ssh).

Every format reaches the nodes the way clustertool does: through the cluster's ssh_config
(pinned host keys with StrictHostKeyChecking yes, the cluster key), never around it.
"""

from __future__ import annotations

import json
import re
import shlex

from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord
from clustertool.core.state import ClusterPaths
from clustertool.remote import access
from clustertool.remote.transport import alias, render_ssh_config

FORMATS = ("ansible", "json", "ssh-config")


def _group(name: str) -> str:
    """Ansible group names are identifiers: letters, digits, underscores."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def ansible(cluster: ClusterRecord, paths: ClusterPaths) -> str:
    """INI inventory: <cluster>_leader, <cluster>_members, and <cluster> holding both."""
    group = _group(cluster.name)
    common = shlex.quote(f"-F {shlex.quote(str(paths.ssh_config))}")  # ansible unquotes, then splits
    lines = [f"# clustertool inventory for cluster {cluster.name} (generated; ssh goes through its ssh_config)",
             f"# access: {access.describe(cluster)}"]
    groups = [("leader", [cluster.leader]), ("members", cluster.members)]
    groups += [("servers", cluster.servers)] if cluster.servers else []
    for suffix, nodes in groups:
        lines.append(f"[{group}_{suffix}]")
        for node in nodes:
            lines.append(f"{node.name} ansible_host={alias(cluster.name, node)} private_address={node.address} "
                         f"slots={node.slots}")
        lines.append("")
    lines += [f"[{group}:children]", *(f"{group}_{suffix}" for suffix, _ in groups), "",
              f"[{group}:vars]", f"ansible_user={cluster.user}", f"ansible_ssh_common_args={common}",
              f"ansible_ssh_private_key_file={paths.key}", ""]
    return "\n".join(lines)


def as_dict(cluster: ClusterRecord, paths: ClusterPaths) -> dict:
    return {
        "cluster": cluster.name,
        "provider": cluster.provider,
        "user": cluster.user,
        "ssh_config": str(paths.ssh_config),
        "key": str(paths.key),
        "known_hosts": str(paths.known_hosts),
        "hostfile": cluster.hostfile_path,
        "access": access.mode(cluster),
        "jump": str(access.jump(cluster)) if access.jump(cluster) else None,
        "nodes": [{"name": n.name, "role": n.role, "address": n.address, "ssh_alias": alias(cluster.name, n),
                   "ssh_host": access.host_name(cluster, n), "ssh_port": n.ssh_port,
                   "proxy_jump": access.hop(cluster, n), "slots": n.slots,
                   "instance_id": n.instance_id} for n in cluster.ordered_nodes()],
    }


def render(cluster: ClusterRecord, fmt: str) -> str:
    paths = ClusterPaths(cluster.name)
    if fmt == "ansible":
        return ansible(cluster, paths)
    if fmt == "json":
        return json.dumps(as_dict(cluster, paths), indent=2) + "\n"
    if fmt == "ssh-config":
        return render_ssh_config(cluster, paths)
    raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}", hint=f"e.g. --format {FORMATS[0]}")
