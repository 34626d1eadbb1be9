"""Cluster lifecycle commands: up, down, status, ls, ssh, hostfile, stop, start, repin."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, NodesOpt, cluster_name, confirm, open_session, reporter
from clustertool.core.errors import UsageError

if TYPE_CHECKING:  # a fast --help
    import click


ForceOwnerOpt = typer.Option(False, "--force-owner",
                             help="Act even on a cluster whose tags say another owner (AWS identity + "
                                  "clustertool home) made it.")


def down(
    cluster: Optional[str] = ClusterOpt,
    sweep: bool = typer.Option(
        False, "--sweep", help="Find clusters no state of this home knows (AWS: tagged resources, listed with "
                               "owner and age; --provider local: namespaces and bridges whose state is gone), and "
                               "offer to delete them. A cluster whose `up` is in flight is never deleted."),
    sweep_provider: str = typer.Option("aws", "--provider", help="Where --sweep looks: aws | local."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region for --sweep."),
    profile: Optional[str] = typer.Option(None, "--profile", help="AWS profile for --sweep."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    terminate_adopted: bool = typer.Option(
        False, "--terminate-adopted", help="Also terminate machines the cluster adopted (never by default)."),
    force_owner: bool = ForceOwnerOpt,
    keep_shared_fs: bool = typer.Option(
        False, "--keep-shared-fs", help="Keep the shared filesystems `up` made (EFS, FSx) with their data; down says "
                                        "what stays and about what it costs a month. Attached ones always stay."),
    any_home: bool = typer.Option(
        False, "--any-home", help="With --sweep: also delete clusters your AWS identity made from another clustertool "
                                  "home (a lost or other machine's), not only this home's."),
    json_output: bool = JsonOpt,
) -> None:
    """Tear a cluster down (by its id), leaving nothing that costs money; forget adopted machines.

    With --sweep --yes the exit code is 1 when a finished cluster that costs money was kept (another
    home's or another owner's): the last line says which, at what hourly rate, and the flag that deletes it."""
    from clustertool.cli import render
    from clustertool.cli.common import cluster_exists
    from clustertool.cluster import lifecycle
    from clustertool.cluster.clusterrequests import DownRequest

    if sweep:
        raise typer.Exit(_sweep(sweep_provider, region, profile, yes, json_output, force_owner, any_home))
    if any_home:
        raise UsageError("--any-home goes with --sweep", hint="clustertool down --sweep --any-home")
    name = cluster_name(cluster)
    stopped = _stop_up_in_flight(name, yes, json_output)
    if stopped is not None:
        yes = True  # asked once, for both
        if not cluster_exists(name):  # it rolled back everything it had made
            if json_output:
                render.print_json({"cluster": name, "stopped_up": stopped, "removed": []})
            else:
                typer.echo(f"{stopped}; nothing of cluster {name} is left")
            return
    request = DownRequest(terminate_adopted=terminate_adopted, force_owner=force_owner, keep_shared_fs=keep_shared_fs)
    session = open_session(name, json_output)
    c = session.record
    if not yes:
        confirm(f"Tear down cluster {name!r} ({len(c.nodes)} {c.provider} node(s))?", what=f"tear down {name!r}",
                kept=f"not torn down: cluster {name!r} is kept", unasked=f"clustertool down -c {name} --yes")
    lines = lifecycle.down(session, request)
    if json_output:
        render.print_json({"cluster": name, "removed": lines, **({"stopped_up": stopped} if stopped else {})})
    else:
        typer.echo(f"{stopped + '; ' if stopped else ''}cluster {name} is down")


def _stop_up_in_flight(name: str, yes: bool, json_output: bool) -> str | None:
    """This home's `up` of ``name`` still running: stop it (SIGTERM rolls it back) once the user agrees."""
    from clustertool.cluster import lifecycle

    pid = lifecycle.up_in_flight(name)
    if pid is None:
        return None
    if not yes:
        confirm(f"Cluster {name!r} is being created by pid {pid}. Stop that `up` (it rolls back what it made) and "
                "tear down whatever is left?", what=f"stop the `up` of {name!r} (pid {pid})",
                kept=f"not stopped: the `up` of {name!r} (pid {pid}) goes on",
                unasked=f"clustertool down -c {name} --yes")
    return lifecycle.stop_up(name, pid, report=reporter(json_output))


def _sweep(provider: str, region: Optional[str], profile: Optional[str], yes: bool, json_output: bool,
           force_owner: bool, any_home: bool = False) -> int:
    """The exit code: 1 under --yes when a billable cluster was kept, else 0."""
    from clustertool.cli import render
    from clustertool.cluster import orphans

    found = orphans.find(provider, region=region, profile=profile, force_owner=force_owner, any_home=any_home,
                         report=reporter(json_output))
    kept = {"kept": found.kept} if found.bills else {}
    code = 1 if yes and found.kept else 0
    if not found.orphans:
        render.print_json({"orphans": []}) if json_output else typer.echo("no orphaned clustertool resources")
        return 0
    if not json_output:
        render.table(found.columns, found.rows, title=found.title)
    if not found.to_delete:
        if json_output:
            render.print_json({"orphans": found.orphans, "removed": [], **kept})
        else:
            typer.echo(found.kept or "nothing to delete")
        return code
    if not yes:
        confirm(f"Delete the {len(found.to_delete)} marked for deletion?", what="delete orphaned resources",
                kept="nothing deleted", unasked=f"clustertool down --sweep --provider {provider} --yes")
    removed, lines = orphans.remove(found, reporter(json_output))
    if json_output:
        render.print_json({"orphans": found.orphans, "removed": removed, "local": lines, **kept})
    else:
        for line in lines:
            typer.echo(line)
        typer.echo(f"removed {len(removed)} {found.unit}")
        if found.kept:
            typer.echo(found.kept)
    return code


def status(
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
    no_check: bool = typer.Option(False, "--no-check", help="Do not test SSH reachability."),
) -> None:
    """Nodes of a cluster: role, address, slots, state, SSH reachability, cordons (and cost where known)."""
    from clustertool.cli import render
    from clustertool.cluster.cordon import describe
    from clustertool.cluster.status import status
    from clustertool.sharedfs import mount

    report = status(open_session(cluster, json_output), check_ssh=not no_check)
    c, rows, extra = report.cluster, report.nodes, report.extra
    if json_output:
        render.print_json(report.to_dict())
        return
    reach = {True: "yes", False: "NO", None: "-"}
    cordoned = {n.name: describe(n.cordon) for n in c.cordoned}
    columns = ["node", "role", "address", "slots", "state", "reachable"] + (["cordon"] if cordoned else [])
    render.table(columns,
                 [(r.node, r.role, r.address, r.slots, r.state,
                   reach[r.reachable] + (f" ({r.detail})" if r.detail else ""))
                  + ((cordoned.get(r.node, "-"),) if cordoned else ()) for r in rows],
                 title=f"cluster {c.name}: {c.provider}, {c.status}, {c.total_slots} slots"
                       + (f" ({len(cordoned)} node(s) cordoned: out of hostfiles and jobs)" if cordoned else ""))
    for key, value in extra.items():
        if key not in ("capacity_wait", "shared_fs"):  # data for --json; the "up" line says it in words
            typer.echo(f"{key}: {value}")
    for line in mount.status_lines(extra.get("shared_fs")):
        typer.echo(line)
    if any(r.reachable is False for r in rows):
        raise typer.Exit(255)


def ls(json_output: bool = JsonOpt) -> None:
    """Clusters this machine knows."""
    from clustertool.cli import render
    from clustertool.cluster import autostop
    from clustertool.cluster.status import list_all, waiting
    from clustertool.core.durations import short_age

    for line in autostop.refresh(list_all(), report=reporter(json_output)):
        reporter(json_output)(line)
    clusters = list_all()
    if json_output:
        render.print_json([{"name": c.name, "id": c.id, "provider": c.provider, "status": c.status,
                            "nodes": len(c.nodes), "cordoned": [n.name for n in c.cordoned],
                            "slots": c.total_slots, "created": c.created, "waiting": waiting(c, short=True)}
                           for c in clusters])
        return
    if not clusters:
        typer.echo("no clusters (bring one up with `clustertool up`)")
        return
    render.table(["name", "provider", "status", "nodes", "slots", "age"],
                 [(c.name, c.provider, waiting(c, short=True) or c.status,
                   f"{len(c.nodes)} ({len(c.cordoned)} cordoned)" if c.cordoned else len(c.nodes), c.total_slots,
                   short_age(time.time() - c.created)) for c in clusters])


def ssh(
    node: Optional[str] = typer.Argument(None, metavar="[NODE]", help="Node (default: the leader)."),
    command: Optional[List[str]] = typer.Argument(None, metavar="[-- COMMAND...]",
                                                  help="Command to run instead of a login shell (after --)."),
    cluster: Optional[str] = ClusterOpt,
) -> None:
    """Open a shell on a node (or run one command), with the cluster's pinned keys."""
    import shlex

    from clustertool.core import nodeset
    from clustertool.remote import transport

    c = open_session(cluster).record
    if node and not command and any(ch.isspace() for ch in node):  # `ssh -- 'uptime; df'`: a command, not a node
        raise UsageError(f"{node!r} is not a node: NODE comes before --",
                         hint=f"clustertool ssh -c {c.name} leader -- {shlex.quote(node)}")
    picked = nodeset.select(c, node or "leader")
    if len(picked) != 1:
        raise UsageError("ssh takes exactly one node", hint="use `clustertool exec` for several")
    line = None
    command = _strip_dashes(command)
    if command:
        line = command[0] if len(command) == 1 else shlex.join(command)
    argv = transport.session_argv(c.name, picked[0], line, tty=line is None and sys.stdin.isatty())
    os.execvp(argv[0], argv)


def _strip_dashes(args: Optional[List[str]]) -> List[str]:
    args = list(args or [])
    return args[1:] if args[:1] == ["--"] else args


def hostfile(
    cluster: Optional[str] = ClusterOpt,
    fmt: str = typer.Option("openmpi", "--format", "-f", help="openmpi | mpich | horovod | deepspeed"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Write to this file instead of stdout."),
) -> None:
    """Print (or write) the cluster's hostfile, leader first, private addresses, with slots (cordoned
    nodes left out)."""
    from clustertool.core import nodeset
    from clustertool.core.hostfile import FORMATS, render_cluster

    if fmt not in FORMATS:
        raise UsageError(f"unknown hostfile format {fmt!r}", hint=f"choose one of: {', '.join(FORMATS)}")
    record = open_session(cluster).record
    text = render_cluster(record, fmt)
    left_out = [n.name for n in record.workers if n.cordoned]
    if left_out:
        names = nodeset.fold(left_out)
        typer.echo(f"left out cordoned {names} (`clustertool uncordon {names}` puts it back)", err=True)
    if output:
        try:
            with open(output, "w") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"-o {output}: cannot write it: {exc.strerror or exc}",
                             hint=f"a file in a folder that exists and you may write, e.g. -o hostfiles/{record.name}")
        typer.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


def stop(cluster: Optional[str] = ClusterOpt, force_owner: bool = ForceOwnerOpt) -> None:
    """Stop the nodes, keeping their disks (the prepared dataset survives)."""
    from clustertool.cluster import lifecycle

    session = open_session(cluster)
    lifecycle.stop(session, force_owner=force_owner)
    name = session.name
    typer.echo(f"cluster {name} stopped (disks kept; `clustertool start -c {name}` resumes)")


def start(cluster: Optional[str] = ClusterOpt, force_owner: bool = ForceOwnerOpt) -> None:
    """Start stopped nodes; refreshes hostfiles and known_hosts, as addresses may change."""
    from clustertool.cluster import lifecycle

    c = lifecycle.start(open_session(cluster), force_owner=force_owner)
    typer.echo(f"cluster {c.name} started; hostfile {c.hostfile_path}")


def repin(cluster: Optional[str] = ClusterOpt, nodes: Optional[str] = NodesOpt) -> None:
    """Re-collect host keys of nodes that were legitimately rebuilt, then re-wire."""
    from clustertool.cluster import wiring
    from clustertool.core import nodeset

    session = open_session(cluster)
    picked = [n.name for n in nodeset.select(session.record, nodes)]
    changed = wiring.repin(session, picked)
    typer.echo(f"re-pinned host keys of {nodeset.fold(changed)}")


def register(app: typer.Typer) -> None:
    for fn in (down, status, ls, hostfile, stop, start, repin):
        app.command()(fn)
    app.command(context_settings={"allow_interspersed_args": False})(ssh)


def click_commands() -> list[click.Command]:
    from clustertool.cli.up import build_up_command

    return [build_up_command()]
