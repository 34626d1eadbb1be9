"""`clustertool doctor`: find what is wrong with a cluster (and fix the safe things)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, open_session, reporter


def doctor(
    cluster: Optional[str] = ClusterOpt,
    json_output: bool = JsonOpt,
    fix: bool = typer.Option(
        False, "--fix", help="Do the safe fixes (kill strays, clear finished jobs' logs, re-push known_hosts), then "
                             "check again."),
    check: List[str] = typer.Option(
        [], "--check", help="Run only these checks (repeat, or comma-separated): reach, ssh-mesh (or mesh), "
                            "disk, sameness, strays, clock, mpi-smoke, links, plugin-nccl (NCCL with the plugin; "
                            "GPU clusters only)."),
    skip: List[str] = typer.Option([], "--skip", help="Skip these checks (repeat, or comma-separated), "
                                                      "e.g. --skip links."),
    plugin_path: Optional[str] = typer.Option(
        None, "--plugin-path", help="Where the NCCL plugin is deployed on the nodes (for its checksum)."),
    disk_path: List[str] = typer.Option(
        [], "--disk-path", help="Folders whose free space to check besides home and the job logs (default /scratch)."),
) -> None:
    """Check SSH mesh, disks, sameness, stray processes, clocks, an MPI smoke test, links and, on GPU
    clusters with the plugin deployed, whether NCCL uses it (`plugin check`)."""
    from clustertool.cli import render
    from clustertool.doctor import choose_checks, run

    checks = choose_checks(check, skip)
    result = run(open_session(cluster, json_output), fix=fix, checks=checks, plugin=plugin_path,
                     disk_paths=list(disk_path) or None, report=reporter(json_output))
    if json_output:
        check_dicts = [{**render.to_jsonable(c), "status": c.status} for c in result.checks]
        render.print_json({"cluster": result.cluster, "clean": result.clean, "fixed": result.fixed,
                           "checks": check_dicts})
        raise typer.Exit(result.exit_code)
    for line in result.fixed:
        typer.echo(f"fixed: {line}")
    for c in result.checks:
        mark = {"ok": "ok  ", "warning": "WARN", "error": "FAIL", "skipped": "skip"}[c.status]
        extra = f" ({c.skipped})" if c.skipped else ""
        typer.echo(f"[{mark}] {c.name}{extra}  {c.seconds:.1f}s")
    for f in result.findings:
        typer.echo(f"{f.severity.upper():7} {f.check} {f.node or 'cluster'}: {f.message}")
        if f.fix:
            typer.echo(f"        fix: {f.fix}")
    if result.clean:
        typer.echo(f"cluster {result.cluster}: clean")
    else:
        n = sum(1 for f in result.findings if f.problem)
        can_fix = any(f.fixable for f in result.findings)
        sys.stderr.write(f"cluster {result.cluster}: {n} problem(s)"
                         + ("; `clustertool doctor --fix` can fix some\n" if can_fix else "\n"))
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
