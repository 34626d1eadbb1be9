"""`clustertool up`: built with click so every provider's options become flags."""

from __future__ import annotations

from typing import Any

import click

from clustertool.cluster.spec import PROVIDERS, OptionSpec, every_provider_option

_TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING}


def _click_option(key: str, spec: OptionSpec, providers: list[str]) -> click.Option:
    flag = "--" + key.replace("_", "-")
    helptext = f"{spec.help} [{', '.join(providers)}]".strip()
    if spec.type is bool:
        return click.Option([flag, key], is_flag=True, flag_value=True, default=None, help=helptext)
    ctype = click.Choice(spec.choices) if spec.choices else _TYPES.get(spec.type, click.STRING)
    return click.Option([flag, key], type=ctype, default=None, help=helptext)


def build_up_command() -> click.Command:
    params: list[click.Parameter] = [
        click.Argument(["spec_file"], required=False, metavar="[SPEC.yaml]"),
        click.Option(["--name"], help="Cluster name (lowercase letters, digits, '-'; default: what it is, e.g. "
                                      "local-2nodes)."),
        click.Option(["--provider", "-p"], type=click.Choice(list(PROVIDERS)),
                     help="Where the nodes come from (default: local)."),
        click.Option(["--nodes", "-N", "nodes"], type=int, help="Number of nodes."),
        click.Option(["--slots"], type=int, help="Slots (GPUs / ranks) per node; default: the provider's GPU count, "
                                                 "else 1."),
        click.Option(["--user"], help="SSH user on the nodes (default: the provider's)."),
        click.Option(["--dry-run"], is_flag=True, help="Print the plan; create nothing."),
        click.Option(["--no-ssh"], is_flag=True,
                     help="Stop after provisioning and the hostfile; do not wire SSH (for endpoints whose instances "
                          "answer no SSH)."),
        click.Option(["--autostop"], metavar="IDLE",
                     help="Stop every node after IDLE (30m, 1h, 90s) with no job and no GPU use; the leader "
                          "decides, so it happens with this machine off. See `clustertool autostop`."),
        click.Option(["--autodown"], is_flag=True, flag_value=True, default=None,
                     help="With --autostop: terminate the nodes instead of stopping them."),
        click.Option(["--wait-for"], type=click.Choice(["jobs", "jobs-and-ssh"]),
                     help="With --autostop: what counts as busy besides GPU use (default: jobs)."),
        click.Option(["--shared-fs"], multiple=True, metavar="KIND[:ID][@PATH]",
                     help="A filesystem every node mounts (repeatable): local (the leader's folder over sshfs), "
                          "efs or fsx (new, deleted by down), efs:fs-... / fsx:fs-... (existing, kept). "
                          "@PATH mounts it there."),
        click.Option(["--shared-mount"], metavar="PATH",
                     help="Where the first --shared-fs without @PATH is mounted (default /shared; the next "
                          "ones /shared2, /shared3 ...)."),
        click.Option(["--scheduler"], type=click.Choice(["none", "slurm"]),
                     help="slurm: set Slurm up on the nodes (slurmctld on the leader, slurmd on every worker, one "
                          "private munge key); `run` then goes through its queue (sbatch/srun), cordons are drains. "
                          "See docs/slurm.md."),
        click.Option(["--no-leader-compute"], is_flag=True,
                     help="With --scheduler slurm: the leader runs slurmctld only, no jobs."),
        click.Option(["--monitoring"], is_flag=True, flag_value=True, default=None,
                     help="Start Prometheus on the cluster once it is up: the node exporter on every node, "
                          "clustertool's exporter and a Prometheus server on the leader's loopback (as `clustertool "
                          "monitoring enable`); started again after stop/start, reboot and replace."),
        click.Option(["--scrape-interval"], metavar="DURATION",
                     help="With --monitoring: how often Prometheus scrapes (default 15s)."),
        click.Option(["--retention-time"], metavar="DURATION",
                     help="With --monitoring: how long Prometheus keeps samples (default 15d)."),
        click.Option(["--retention-size"], metavar="SIZE",
                     help="With --monitoring: the most disk Prometheus's samples take on the leader (default 2GB)."),
        click.Option(["--controller"], is_flag=True,
                     help="Start the cluster's recovery controller once it is up: it replaces the nodes that jobs "
                          "run with --replace-failed lose, with nobody watching (local: a detached process on this "
                          "machine; `status` shows it, `down` stops it first)."),
        click.Option(["--controller-node"], metavar="NODE",
                     help="AWS: the node whose instance profile gets the controller's rights (only what `replace` "
                          "needs, only on this cluster); implies --controller."),
        click.Option(["--json", "json_output"], is_flag=True, help="Print the result as JSON."),
    ]
    for key, (spec, providers) in sorted(every_provider_option().items()):
        params.append(_click_option(key, spec, providers))
    return click.Command(
        "up", params=params, callback=_up,
        help=("Bring a cluster up: provision nodes (local namespaces, AWS, or adopt existing machines), "
              "pin host keys, give every node the cluster key, write hostfiles/<cluster> and ~/hostfile "
              "on the leader. Flags override keys of SPEC.yaml. All or nothing: a failure removes what was made."),
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _up(spec_file: str | None, name: str | None, provider: str | None, nodes: int | None, slots: int | None,
        user: str | None, dry_run: bool, no_ssh: bool, json_output: bool, autostop: str | None,
        autodown: bool | None, wait_for: str | None, shared_fs: tuple[str, ...], shared_mount: str | None,
        scheduler: str | None, no_leader_compute: bool, monitoring: bool | None, scrape_interval: str | None,
        retention_time: str | None, retention_size: str | None, controller: bool, controller_node: str | None,
        **options: Any) -> int:
    from clustertool.cli import render
    from clustertool.cli.common import reporter
    from clustertool.cluster import lifecycle, spec, sshinclude
    from clustertool.cluster.clusterrequests import UpRequest
    from clustertool.core.model import ClusterState
    from clustertool.remote import access

    overrides = {"name": name, "provider": provider, "nodes": nodes, "slots": slots, "user": user,
                 "autostop": autostop, "autodown": autodown, "wait_for": wait_for,
                 "shared_fs": list(shared_fs) or None, "shared_mount": shared_mount, "scheduler": scheduler,
                 "leader_compute": False if no_leader_compute else None, "monitoring": monitoring,
                 "scrape_interval": scrape_interval, "retention_time": retention_time,
                 "retention_size": retention_size, **options}
    request = UpRequest(spec.load_spec(spec_file, overrides), dry_run=dry_run, no_ssh=no_ssh, controller=controller,
                        controller_node=controller_node)
    result = lifecycle.up(request, report=reporter(json_output))
    if dry_run:
        if json_output:
            render.print_json(result.to_dict())
        else:
            for line in result.plan:
                click.echo(line)
        return 0
    cluster = result.cluster
    assert cluster is not None  # only a dry run has none
    if json_output:
        render.print_json(result.to_dict())
        return 0
    render.table(["node", "role", "address", "slots"],
                 [(n.name, n.role, n.address, n.slots) for n in cluster.ordered_nodes()],
                 title=f"cluster {cluster.name} ({cluster.provider}) is up in {result.timings.get('total', 0):.1f}s")
    click.echo(f"hostfile: {result.hostfile}")
    click.echo(f"access:   {access.describe(cluster)}")
    if cluster.status == ClusterState.READY:
        plain = f"ssh {cluster.name}-leader" if sshinclude.active() else f"clustertool ssh -c {cluster.name}"
        click.echo(f"ssh:      {plain}   |   clustertool exec -c {cluster.name} -- hostname")
    if cluster.scheduler and cluster.scheduler.get("release"):
        click.echo(f"slurm:    {cluster.scheduler['release']}, partition {cluster.scheduler.get('partition')}: "
                   "`clustertool run` queues through sbatch; `clustertool jobs` shows the queue")
    controller_line = cluster.options.get("controller") and _controller_line(cluster.name)
    if controller_line:
        click.echo(f"controller: {controller_line}")
    if result.monitoring is not None:
        click.echo("monitoring: " + (f"not started ({'; '.join(result.monitoring.problems)}); "
                                     f"`clustertool monitoring enable -c {cluster.name}` tries again"
                                     if result.monitoring.problems else
                                     f"Prometheus on the leader; `clustertool metrics -c {cluster.name}` reaches it"))
    return 0


def _controller_line(name: str) -> str | None:
    from clustertool.cluster import controllerproc

    return controllerproc.status_line(name)
