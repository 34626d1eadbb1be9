"""Waiting for nodes this machine cannot see: those behind the user's bastion (``--jump``) and
members behind the leader (``--access leader``), before their keys are pinned and SSH is wired.

The leader checks its members' SSH ports on the private network; that first connection to the
leader is also the persistent one every member's connection then rides on."""

from __future__ import annotations

import time

from clustertool.core.errors import RemoteError
from clustertool.core.model import GroupResult
from clustertool.remote import access, keys, mesh
from clustertool.remote.group import run_on_nodes
from clustertool.remote.transport import Link, write_ssh_config


def _raise_on_failures(result: GroupResult, what: str) -> None:
    bad = result.failed()
    if bad:
        detail = "; ".join(f"{r.node}: {r.reason}" for r in bad)
        raise RemoteError(f"{what} failed on {len(bad)} node(s): {detail}")


def _through_bastion(link: Link, limit: float = 180.0) -> None:
    """Nodes reached through the user's bastion (this machine cannot see their ports): until each
    answers SSH through it, or ``limit`` seconds."""
    cluster = link.record
    pending = [n for n in cluster.nodes if access.jump(cluster) and access.hop(cluster, n) == access.jump_alias(
        cluster.name) and n.host_keys]
    deadline = time.monotonic() + limit
    while pending:
        failed = run_on_nodes(link, pending, "true", timeout=30).failed()
        pending = [n for n in pending if n.name in {r.node for r in failed if r.reason.startswith("unreachable")}]
        if pending and time.monotonic() > deadline:
            raise RemoteError(f"{', '.join(n.name for n in pending)} did not answer SSH through --jump "
                              f"{access.jump(cluster)} within {limit:.0f}s", hint="check the bastion's route and "
                              "the cluster security group")
        if pending:
            time.sleep(3)


def wait_behind_jumps(link: Link) -> None:
    """Pin the bastion's key and wait for the nodes behind it; then the leader waits for its members
    (keys: the provider's, else the leader's own is scanned from here unless it is behind a bastion)."""
    cluster = link.record
    keys.pin_jump_keys(cluster)
    if access.jump(cluster):
        keys.write_local_known_hosts(cluster)
        write_ssh_config(cluster)
        _through_bastion(link)
    behind = [n for n in cluster.nodes if access.behind_leader(cluster, n)]
    if not behind:
        return
    if not cluster.leader.host_keys and not access.jump(cluster):
        cluster.leader.host_keys = keys.keyscan(cluster.leader)
    keys.write_local_known_hosts(cluster)
    write_ssh_config(cluster)
    result = run_on_nodes(link, [cluster.leader], "bash -s", timeout=180,
                          stdin_data=mesh.port_wait_script(behind).encode())
    _raise_on_failures(result, "waiting for the members through the leader")
    failed = mesh.failed_targets(result.results[0].stdout)
    if failed:
        by_addr = {n.address: n.name for n in cluster.nodes}
        detail = "; ".join(f"{by_addr.get(a, a)}: {why}" for a, why in failed.items())
        raise RemoteError(f"the leader cannot reach {detail}", hint="check sshd and the cluster security group")
