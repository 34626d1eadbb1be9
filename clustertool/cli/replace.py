"""`replace`: a new machine for a node that died, under the same name, role, slots and address."""

from __future__ import annotations

from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, confirm, open_session


def replace(
    nodes: List[str] = typer.Argument(..., metavar="NODE...",
                                      help="Nodes by name (node-3), range (node-[3-4]) or comma list."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    copy: List[str] = typer.Option([], "--copy", metavar="SRC",
                                   help="Then copy SRC from the leader to the same path on the new node(s), through "
                                        "the relay, verified (repeat; e.g. the dataset the old disk held)."),
    keep_old: bool = typer.Option(False, "--keep-old",
                                  help="AWS: stop the old instance instead of terminating it, tagged "
                                       "clustertool:replaced-by=<new id> (its disk kept for a look; `status` lists "
                                       "it, `down` removes it).  Not for spot instances or local nodes."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Replace nodes with new machines: same name, role, slots, address and place in the hostfiles.

    For a node that died (or misbehaves): the old machine is removed (its processes, and with it
    everything on its disk: home, /scratch, /tmp) and a new one made; its new host key is pinned
    and the old one removed from every known_hosts, here and on every node; the cluster key and
    hostfiles are pushed again.  A cordon on a replaced node is lifted.  Each node is all or
    nothing: a failure removes what was made for it and marks it in `status`.

    Local provider: a new namespace, sshd and disk (the leader too).  AWS: one new instance in the
    node's zone, subnet, placement group and security groups, of its type, image, volume, EFA
    interfaces, tags and shutdown behaviour; it must run with both status checks passed before
    the old one is terminated (or, --keep-old, stopped); a replaced leader takes the cluster's
    Elastic IP.  No capacity in the zone: one line, nothing made, the node unchanged.  Static /
    adopted machines are not ours to replace: `cordon` them."""
    from clustertool.cli import render
    from clustertool.cluster.clusterrequests import ReplaceRequest, selection
    from clustertool.transfer.refill import replace_and_refill

    request = ReplaceRequest(selection(nodes), copy=tuple(copy), keep_old=keep_old)
    session = open_session(cluster, json_output)
    if not yes:
        picked = " ".join(nodes)
        confirm(f"Replace {picked} of {session.name!r}? Everything on the old disk is lost", what=f"replace {picked}",
                kept=f"not replaced: {picked} of {session.name!r} kept",
                unasked=f"clustertool replace -c {session.name} {picked} --yes",
                note="everything on the old disk is lost")
    result = replace_and_refill(session, request)
    if json_output:
        render.print_json(result.to_dict())
        return
    for r in result.replaced:
        keys = (f"host key {r.new_host_key} pinned (was {r.old_host_key})" if r.new_host_key
                else "no host key pinned yet")
        typer.echo(f"{r.node} replaced in {r.seconds:.1f}s: {keys}"
                   + ("; its cordon is lifted" if r.cordon_lifted else ""))
        if r.old_instance:
            typer.echo(f"  {r.new_instance} took the place of {r.old_instance}"
                       + (", which is stopped and kept (tagged clustertool:replaced-by; `down` removes it)"
                          if r.kept_old else ", which is terminated"))
    typer.echo(result.disk if not result.copied else f"what was on the old disk is gone; {', '.join(copy)} copied "
               f"back from {session.record.leader.name}")
    leaders = "" if session.record.no_ssh else " and the leader's ~/hostfile"  # --no-ssh: nothing pushed to nodes
    typer.echo(f"hostfile {result.hostfile}{leaders} written ({result.seconds:.1f}s in all)")


def register(app: typer.Typer) -> None:
    app.command()(replace)
