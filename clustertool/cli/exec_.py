"""`clustertool exec -- COMMAND`: run on every node, live, then folded."""

from __future__ import annotations

from typing import List, Optional

import typer

from clustertool.cli.common import ClusterOpt, JsonOpt, NodesOpt, open_session


def exec_(
    command: List[str] = typer.Argument(
        ..., metavar="-- COMMAND...",
        help="Command to run (after --). One argument is a shell line; several are quoted each."),
    cluster: Optional[str] = ClusterOpt,
    nodes: Optional[str] = NodesOpt,
    timeout: Optional[float] = typer.Option(
        None, "--timeout", "-t",
        help="Seconds before a node counts as hung (exit 255); its command is stopped there too."),
    json_output: bool = JsonOpt,
    live: bool = typer.Option(True, "--live/--no-live", help="Stream output prefixed by node while it runs."),
) -> None:
    """Run a command on the selected nodes in parallel (the old runclust).

    Output streams live as `node-3: line`, then identical outputs are printed once per node set
    (node-[1-3,5]). Exit code: the highest remote one; 255 if a node was unreachable or timed out.
    """
    from clustertool.cli import render
    from clustertool.core import nodeset
    from clustertool.remote.execute import execute
    from clustertool.remote.remoterequests import ExecRequest

    request = ExecRequest(tuple(command), nodes=nodes, timeout=timeout)
    on_line = render.live_line if live and not json_output else None
    result = execute(open_session(cluster), request, on_line=on_line)
    if json_output:
        render.print_json(result.to_dict())
    else:
        render.folded_output(result, nodeset.fold, only_if_folds=on_line is not None)
        render.group_summary(result, nodeset.fold)
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("exec", context_settings={"allow_interspersed_args": False})(exec_)
