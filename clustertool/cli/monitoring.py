"""`clustertool monitoring enable|disable|status` and `clustertool metrics [query]`: Prometheus on the cluster."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session

monitoring_app = typer.Typer(
    name="monitoring", no_args_is_help=True, add_completion=False,
    help="Prometheus on a running cluster: the node exporter on every node (GPU metrics through its textfile "
         "collector where nvidia-smi answers), clustertool's exporter and a Prometheus server on the leader. "
         "Nothing listens beyond the cluster: `clustertool metrics` reaches it through ssh.")
metrics_app = typer.Typer(
    name="metrics", invoke_without_command=True, add_completion=False,
    help="Reach the cluster's Prometheus: forward its port over ssh and print the local URL (until Ctrl-C), "
         "or `metrics query EXPR`.")


def _show(result: Any, json_output: bool) -> None:
    from clustertool.cli import render

    if json_output:
        render.print_json(result.to_dict())
    else:
        from clustertool.cluster.monitoring import PROCESSES

        render.table(["NODE", *[p.upper() for p in PROCESSES]],
                     [[node, *[procs.get(p, "-") for p in PROCESSES]] for node, procs in result.nodes.items()])
        if result.prometheus:
            typer.echo(f"prometheus: {result.prometheus}; `clustertool metrics -c {result.cluster}` reaches it")
        for line in result.problems:
            typer.echo(f"problem: {line}", err=True)
    raise typer.Exit(result.exit_code)


@monitoring_app.command("enable")
def enable(
    cluster: Optional[str] = ClusterOpt,
    scrape_interval: str = typer.Option("15s", "--scrape-interval", metavar="DURATION",
                                        help="How often Prometheus scrapes (and the exporter reads the nodes)."),
    retention_time: str = typer.Option("15d", "--retention-time", metavar="DURATION",
                                       help="How long Prometheus keeps samples (its form: 12h, 15d, 4w)."),
    retention_size: str = typer.Option("2GB", "--retention-size", metavar="SIZE",
                                       help="The most disk Prometheus's samples take on the leader (500MB, 2GB)."),
    json_output: bool = JsonOpt,
) -> None:
    """Start the stack on every node (again, with these settings, where it runs)."""
    from clustertool.cluster import monitoring

    request = monitoring.MonitoringRequest(scrape_interval, retention_time, retention_size)
    _show(monitoring.enable(open_session(cluster, json_output), request), json_output)


@monitoring_app.command("disable")
def disable(cluster: Optional[str] = ClusterOpt, json_output: bool = JsonOpt) -> None:
    """Stop every process of the stack on every node (Prometheus's data stays on the leader)."""
    from clustertool.cluster import monitoring

    _show(monitoring.disable(open_session(cluster, json_output)), json_output)


@monitoring_app.command("status")
def status(cluster: Optional[str] = ClusterOpt, json_output: bool = JsonOpt) -> None:
    """What runs on each node."""
    from clustertool.cluster import monitoring

    _show(monitoring.status(open_session(cluster, json_output)), json_output)


@monitoring_app.command("dashboard")
def dashboard(output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE",
                                                   help="Write it here (default: stdout).")) -> None:
    """The Grafana dashboard that ships with clustertool (JSON: import it, with this Prometheus as its source)."""
    import json

    import clustertool.watch.metrics

    text = json.dumps(clustertool.watch.metrics.dashboard(), indent=1) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        typer.echo(f"wrote {output}", err=True)


@metrics_app.callback()
def metrics(
    ctx: typer.Context,
    cluster: Optional[str] = ClusterOpt,
    port: Optional[int] = typer.Option(None, "--port", metavar="PORT", help="Local port (default: a free one)."),
) -> None:
    """Forward Prometheus's port over ssh, print the local URL, hold it open until Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"cluster": cluster}
        return
    from clustertool.watch.metrics import forward

    tunnel = forward(open_session(cluster), port)
    typer.echo(tunnel.url, nl=True)
    typer.echo(f"Prometheus of the cluster through ssh; Ctrl-C closes it (try {tunnel.url}/graph)", err=True)
    stop = {"now": False}
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        while not stop["now"] and tunnel.proc.poll() is None:
            try:
                tunnel.proc.wait(timeout=0.5)
            except Exception:  # still running: look again
                continue
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        tunnel.close()


@metrics_app.command("query")
def query(
    ctx: typer.Context,
    expr: str = typer.Argument(..., metavar="EXPR", help="A PromQL expression, e.g. 'up' or "
                                                          "'clustertool_rank_steps_per_second'."),
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
) -> None:
    """One instant query, asked on the leader: one line per series (or Prometheus's data with --json)."""
    import clustertool.watch.metrics
    from clustertool.cli import render

    name = cluster or (ctx.obj or {}).get("cluster")
    data = clustertool.watch.metrics.query(open_session(name, json_output), expr)
    if json_output:
        render.print_json(data)
        return
    for series, value in clustertool.watch.metrics.rows(data):
        typer.echo(f"{series} {value}".strip())


def register(app: typer.Typer) -> None:
    app.add_typer(monitoring_app, name="monitoring")
    app.add_typer(metrics_app, name="metrics")
