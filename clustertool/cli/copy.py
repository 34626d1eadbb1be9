"""`clustertool copy` and `clustertool sync-s3`: data onto every node, verified per node."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, NodesOpt, cluster_name, reporter


def copy_cmd(
    src: str = typer.Argument(..., help="Source path: on the leader (--from leader) or here (--from local)."),
    dest: str = typer.Argument(..., help="Destination directory on every selected node."),
    cluster: Optional[str] = ClusterOpt,
    nodes: Optional[str] = NodesOpt,
    source: str = typer.Option("leader", "--from", help="Where SRC is: leader (default) or local."),
    strategy: str = typer.Option(
        "auto", "--strategy", help="auto, chain (pipelined relay) or fanout (parallel rsync)."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify",
        help="Check every file by hash: each node hashes what it writes as it writes it and compares with "
             "the source's hash of what it sent; files not sent this time are re-read on both sides."),
    verify_only: bool = typer.Option(
        False, "--verify-only", help="Copy nothing: re-read every file on the nodes and at the source and compare "
                                     "(catches a byte changed on a node's disk after the copy)."),
    delete: bool = typer.Option(False, "--delete", help="Remove files on the nodes that SRC does not have."),
    cipher: str = typer.Option(
        "aes128-gcm@openssh.com", "--cipher", help="ssh cipher between nodes ('' for ssh's default)."),
    json_output: bool = JsonOpt,
) -> None:
    """Copy SRC to DEST on the selected nodes (the old copyclust), incremental and verified.

    A directory SRC is mirrored into DEST; a file lands in DEST/. Default nodes: the members
    (--from leader) or every node (--from local). Verification costs no second read of what was
    sent (hashed in the stream); --verify-only re-reads everything. Exit code: 0 when every node
    matches the source; 1 when a node failed or differs (named with its files); 255 when one was
    unreachable.
    """
    from clustertool.cli import progress, render
    from clustertool.transfer.copy import copy

    name = cluster_name(cluster)
    bars = progress.NodeProgress([], enabled=not json_output)
    with bars:
        result = copy(name, src, dest, source=source, selection=nodes, strategy=strategy,
                      verify_after=verify, delete=delete, cipher=cipher or None,
                      on_progress=bars.update, report=reporter(json_output), verify_only=verify_only)
    if json_output:
        render.print_json({"exit_code": result.exit_code, **render.to_jsonable(result)})
    else:
        progress.copy_table(result)
        for line in progress.mismatch_lines(result):
            sys.stderr.write(line + "\n")
        render.info(progress.copy_summary(result))
    raise typer.Exit(result.exit_code)


def sync_s3_cmd(
    url: str = typer.Argument(..., help="s3://bucket/prefix to pull."),
    dest: str = typer.Argument(..., help="Destination directory on every selected node."),
    cluster: Optional[str] = ClusterOpt,
    nodes: Optional[str] = NodesOpt,
    shard: bool = typer.Option(False, "--shard", help="Give node i of N a disjoint 1/N of the objects."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", envvar="AWS_ENDPOINT_URL",
                                               help="S3-compatible endpoint (default: AWS_ENDPOINT_URL, else AWS)."),
    pass_credentials: bool = typer.Option(False, "--pass-credentials",
                                          help="Send this machine's AWS credentials to the nodes (over ssh stdin, "
                                               "never argv)."),
    json_output: bool = JsonOpt,
) -> None:
    """Every node pulls s3://bucket/prefix into DEST at once, incremental, checked per node.

    Nodes use their own credentials (instance role, ~/.aws, environment) unless
    --pass-credentials. Exit code as for exec: the highest per node; 255 unreachable.
    """
    from clustertool.cli import progress, render
    from clustertool.transfer.s3 import sync_s3

    result = sync_s3(cluster_name(cluster), url, dest, selection=nodes, shard=shard,
                     endpoint_url=endpoint_url, pass_credentials=pass_credentials,
                     report=reporter(json_output))
    if json_output:
        render.print_json({"exit_code": result.exit_code, **render.to_jsonable(result)})
    else:
        progress.sync_table(result)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("copy")(copy_cmd)
    app.command("sync-s3")(sync_s3_cmd)
