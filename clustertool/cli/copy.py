"""`clustertool copy` and `clustertool sync-s3`: data onto every node, verified per node."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, NodesOpt, open_session


def copy_cmd(
    src: str = typer.Argument(..., metavar="SRC",
                              help="Source path: on the leader (--from leader) or here (--from local)."),
    dest: str = typer.Argument(..., metavar="DEST", help="Destination directory on every selected node."),
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
    from clustertool.transfer.transferrequests import CopyRequest

    request = CopyRequest(src, dest, source=source, nodes=nodes, strategy=strategy, verify=verify,
                          verify_only=verify_only, delete=delete, cipher=cipher)
    session = open_session(cluster, json_output)
    with progress.NodeProgress([], enabled=not json_output) as bars:
        result = copy(session, request, on_progress=bars.update)
    if json_output:
        render.print_json(result.to_dict())
    else:
        progress.copy_table(result)
        for line in progress.mismatch_lines(result):
            sys.stderr.write(line + "\n")
        render.info(progress.copy_summary(result))
    raise typer.Exit(result.exit_code)


def sync_s3_cmd(
    url: str = typer.Argument(..., metavar="s3://BUCKET/PREFIX",
                              help="s3://bucket/prefix to pull (a prefix is a folder, as with aws s3 sync)."),
    dest: str = typer.Argument(..., metavar="DEST", help="Destination directory on every selected node."),
    cluster: Optional[str] = ClusterOpt,
    nodes: Optional[str] = NodesOpt,
    shard: bool = typer.Option(False, "--shard", help="Give node i of N a disjoint 1/N of the objects."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", envvar="AWS_ENDPOINT_URL",
                                               help="S3-compatible endpoint (default: AWS_ENDPOINT_URL, else AWS)."),
    region: Optional[str] = typer.Option(None, "--region", help="Region to sign for (default: the bucket's)."),
    threads: int = typer.Option(8, "--threads", min=1, max=64, help="Downloads at once on each node."),
    url_expiry: str = typer.Option("15m", "--url-expiry", metavar="DURATION",
                                   help="Life of each presigned URL (e.g. 900, 15m, 2h; at most 7d). "
                                        "A node whose URL expires gets a fresh one and goes on."),
    recheck: bool = typer.Option(False, "--recheck", help="Re-hash files that look up to date against the "
                                                          "ETag; fetch again those that differ."),
    pass_credentials: bool = typer.Option(False, "--pass-credentials", hidden=True,
                                          help="Does nothing now: nodes get presigned URLs, never credentials."),
    json_output: bool = JsonOpt,
) -> None:
    """Every node pulls s3://bucket/prefix into DEST at once, incremental, verified per node.

    This machine lists the prefix (boto3, your usual AWS credentials) and gives each node
    short-lived presigned GET URLs: no credentials ever reach a node. Nodes download with their
    own python3, --threads at a time, resumable, each file checked against its ETag while written.
    A re-run fetches only what is missing or changed. Exit code: 0 when every node has every
    object; 1 when a node failed (named, with its objects); 255 when one was unreachable.
    """
    from clustertool.cli import progress, render
    from clustertool.transfer.s3 import sync_s3
    from clustertool.transfer.s3bucket import parse_duration
    from clustertool.transfer.transferrequests import SyncS3Request

    if pass_credentials:
        sys.stderr.write("note: --pass-credentials does nothing now: nodes get presigned URLs, never credentials\n")
    request = SyncS3Request(url, dest, nodes=nodes, shard=shard, endpoint_url=endpoint_url, region=region,
                            threads=threads, url_expiry=parse_duration(url_expiry), recheck=recheck)
    session = open_session(cluster, json_output)
    with progress.NodeProgress([], enabled=not json_output) as bars:
        result = sync_s3(session, request, on_progress=bars.update)
    if json_output:
        render.print_json({"exit_code": result.exit_code, **render.to_jsonable(result)})
    else:
        progress.sync_table(result)
        render.info(progress.sync_summary(result))
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("copy")(copy_cmd)
    app.command("sync-s3")(sync_s3_cmd)
