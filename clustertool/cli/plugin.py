"""`clustertool plugin build|deploy|status|env|check`: the native NCCL plugin on the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session

if TYPE_CHECKING:  # a fast --help
    from clustertool.plugin.deploy import PluginStatus

plugin_app = typer.Typer(name="plugin", no_args_is_help=True, add_completion=False,
                         help="Build the native NCCL plugin (net + CollNet + tuner), put it on every node, check it.")


@plugin_app.command("build")
def build_cmd(
    on: str = typer.Option("local", "--on", help="local: compile here (native/); leader: on the leader, "
                           "so it links against the nodes' libraries."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Compile native/ and report the artefact's version and checksum."""
    from dataclasses import asdict

    from clustertool.cli import render
    from clustertool.cli.common import known_clusters
    from clustertool.core.errors import UsageError
    from clustertool.plugin import build

    if on not in ("local", "leader"):
        raise UsageError(f"--on {on!r}: choose local or leader", hint="clustertool plugin build --on local")
    if cluster is not None:
        open_session(cluster)  # a cluster that does not exist: said before anything is built
    if on == "leader":
        session = open_session(cluster)
        b = build.build_on_leader(session)
        build.remember_build(session.name, b)
    else:
        b = build.build_local()
        known = known_clusters()
        name = cluster or (known[0] if len(known) == 1 else None)
        if name:
            build.remember_build(name, b)
    if json_output:
        render.print_json(asdict(b))
        return
    render.kv([("version", b.version), ("sha256", b.sha256), ("built on", b.built_on), ("folder", b.dir)])


@plugin_app.command("deploy")
def deploy_cmd(
    dest: Optional[str] = typer.Option(None, "--dest", help="Folder on every node (default /opt/clustertool/lib; "
                                       "local clusters: ~/.clustertool/lib of each node)."),
    tuner_table: Optional[Path] = typer.Option(None, "--tuner-table", exists=True, dir_okay=False,
                                               help="CSV for the tuner plugin (e.g. from `bench allreduce "
                                                    "--tuner-csv`)."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Put the same build on every node and verify every node's checksum.

    All or nothing: the files are staged and checked on every node first; if any node
    fails, no node is changed. Jobs then use it with `clustertool run --plugin`
    (NCCL_NET_PLUGIN, NCCL_COLLNET_ENABLE=1, NCCL_TUNER_PLUGIN, LD_LIBRARY_PATH).
    On AWS this NCCL_NET_PLUGIN replaces the EFA plugin as NCCL's net (point-to-point
    calls are forwarded to libnccl-net-ofi.so when present) and NCCL_TUNER_PLUGIN
    replaces the EFA plugin's own tuner.
    """
    from clustertool.plugin import build, deploy

    session = open_session(cluster, json_output)
    rows = deploy.deploy(session, build.current_build(session.name), dest=dest, tuner_table=tuner_table)
    _show(rows, json_output)


@plugin_app.command("status")
def status_cmd(cluster: Optional[str] = ClusterOpt, json_output: bool = JsonOpt) -> None:
    """Per node: installed version and checksum, and whether it matches the local build."""
    from clustertool.core.errors import ToolError
    from clustertool.plugin import build, deploy

    session = open_session(cluster)
    try:
        b = build.current_build(session.name)
    except ToolError:
        b = None
    rows = deploy.status(session, b)
    _show(rows, json_output)
    raise typer.Exit(0 if all(r.matches for r in rows) else 1)


@plugin_app.command("env")
def env_cmd(cluster: Optional[str] = ClusterOpt) -> None:
    """Print the job environment for the deployed plugin (NAME=VALUE lines)."""
    from clustertool.plugin.deploy import plugin_env

    for k, v in plugin_env(open_session(cluster).record).items():
        typer.echo(f"{k}={v}")


@plugin_app.command("check")
def check_cmd(
    sizes: str = typer.Option("1M:64M", "--sizes", help="MIN:MAX message sizes in bytes (K/M/G), doubling."),
    iters: int = typer.Option(5, "--iters", "-n", help="Timed allreduces per size."),
    warmup: int = typer.Option(2, "--warmup", "-w", help="Untimed allreduces per size."),
    python: Optional[str] = typer.Option(
        None, "--python", metavar="PATH", help="The nodes' python with torch (default: the first of python3, "
                                               "/opt/pytorch/bin/python3, /opt/conda/envs/pytorch/bin/python, ... "
                                               "that has torch)."),
    timeout: float = typer.Option(600, "--timeout", help="Seconds before the run counts as hung (it is killed)."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """Is NCCL using the plugin, and which algorithm did it pick?

    GPU clusters: a short NCCL allreduce over every slot (one rank per GPU) as a `run --plugin`
    job with NCCL_DEBUG=INFO, then NCCL's version, the plugin and ABI version NCCL loaded,
    CollNet on (or NCCL's reason for off), algorithm/protocol and busbw per size and #wrong
    against a CPU reference. Without GPUs: says so and runs the collnet_bench stand-in (not
    NCCL). With reduction servers (`up --reduction-servers K`) the job starts their reducers: the
    GPU report names the plugin's CollNet algorithm (servers, or what it fell back to); the
    stand-in runs servers beside sharded, ring and mpi. Exit code 1 if NCCL did not load the
    plugin, a run failed or #wrong > 0; the plugin must be deployed (and unchanged) on every node.
    """
    from clustertool.cli import render
    from clustertool.doctor import plugin_check

    result = plugin_check.run(open_session(cluster, json_output), sizes=sizes, iters=iters, warmup=warmup,
                              python=python, timeout=timeout)
    if json_output:
        render.print_json({**render.to_jsonable(result), "wrong": result.wrong, "ok": result.ok})
    else:
        render.check_report(result)
    raise typer.Exit(result.exit_code)


def _show(rows: list[PluginStatus], json_output: bool) -> None:
    from dataclasses import asdict

    from clustertool.cli import render

    if json_output:
        render.print_json([asdict(r) for r in rows])
        return
    render.table(["node", "version", "sha256", "matches build", "note"],
                 [[r.node, r.version or "-", (r.sha256 or "-")[:16], "yes" if r.matches else "NO", r.error or ""]
                  for r in rows])


def register(app: typer.Typer) -> None:
    app.add_typer(plugin_app, name="plugin")
