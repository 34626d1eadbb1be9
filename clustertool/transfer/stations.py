"""A chain's stations on the nodes: which relay runs where, prepared ahead or in a round of
their own, the chain's head, and taking stations down.

Prepared ahead: the copy's first round (the survey, which lists DEST on every target anyway)
also prepares pass 0 of a chain through every target in order, so its links connect while
this machine plans.  When the plan needs exactly that chain (a fresh copy, or new data for
every node), the stream starts at once; otherwise those stations are taken down in the
background and the pass is prepared in its own round.
"""

from __future__ import annotations

import sys
import threading

from clustertool.core.errors import RemoteError
from clustertool.core.model import Node
from clustertool.nodeprogs import program_text, python_command
from clustertool.remote.group import run_on_nodes
from clustertool.transfer import chain
from clustertool.transfer.results import CopyRun

AHEAD = 0  # the pass number of stations prepared in the survey


def hops(run: CopyRun, pending: list[Node]) -> list[tuple[Node, bool]]:
    """(node, writes?) in chain order; from local the leader is always the first hop."""
    out = [(n, True) for n in pending]
    if run.from_local:
        leader = run.cluster.leader
        out = [(leader, any(n.name == leader.name for n in pending))] + \
              [(n, True) for n in pending if n.name != leader.name]
    return out


def sdir(run: CopyRun, name: str, pass_no: int) -> str:
    return chain.status_dir(run.run_id, name, pass_no)


def hop_stations(run: CopyRun, route: list[tuple[Node, bool]], pass_no: int) -> dict[str, list[dict]]:
    """Every hop's station: its relay (which the previous hop's dialer starts) and its dialer."""
    per: dict[str, list[dict]] = {}
    for i, (node, writes) in enumerate(route):
        nxt = route[i + 1][0] if i + 1 < len(route) else None
        args = chain.hop_args(node.name, sdir(run, node.name, pass_no), run.dest, writes,
                               (nxt.address, sdir(run, nxt.name, pass_no)) if nxt else None, run.cipher)
        per.setdefault(node.name, []).append(chain.hop_station(args))
    return per


def source_station(run: CopyRun, first: Node, pass_no: int) -> list[dict]:
    """The leader's dialer to the first hop (none from local: the head here dials itself)."""
    if run.from_local:
        return []
    return [chain.source_station(sdir(run, "source", pass_no), (first.address, sdir(run, first.name, pass_no)),
                                  run.cipher)]


def ahead(run: CopyRun) -> tuple[dict[str, list[dict]], list[dict]]:
    """Pass 0 through every target, for the survey: (hop stations per node, the source's)."""
    route = hops(run, run.targets)
    run.ahead = [n.name for n, _ in route]
    return hop_stations(run, route, AHEAD), source_station(run, route[0][0], AHEAD)


def use_ahead(run: CopyRun, route: list[tuple[Node, bool]]) -> bool:
    """Is the chain this pass needs the one prepared ahead?  If not, take that one down."""
    if run.ahead is None:
        return False
    same = [n.name for n, _ in route] == run.ahead
    if same:
        run.ahead = None  # in use: its stations end with the stream
    else:
        discard_ahead(run)
    return same


def discard_ahead(run: CopyRun) -> None:
    """Take the stations prepared ahead down, in the background (copy waits for it at its end)."""
    if run.ahead is None:
        return
    nodes = {n.name: n for n in run.targets}
    nodes[run.cluster.leader.name] = run.cluster.leader
    run.ahead = None
    worker = threading.Thread(target=abort, args=(run, list(nodes.values()), AHEAD), daemon=True)
    worker.start()
    run.cleanups.append(worker)


def prepare(run: CopyRun, route: list[tuple[Node, bool]], pass_no: int) -> list[tuple[Node, bool]]:
    """Prepare a pass's stations in one round; drop hops that cannot be reached and rewire."""
    leader = run.cluster.leader
    while route:
        per = hop_stations(run, route, pass_no)
        src = source_station(run, route[0][0], pass_no)
        if src:
            per.setdefault(leader.name, []).extend(src)
        nodes = [n for n, _ in route] + ([leader] if src and leader.name not in {n.name for n, _ in route} else [])
        group = run_on_nodes(run.session, nodes, python_command(),
                             stdin_data=lambda n: chain.prepare_program(per[n.name]), timeout=60)
        bad = {r.node: r for r in group.failed()}
        if src and leader.name in bad:
            abort(run, nodes, pass_no)
            raise RemoteError(f"cannot start the copy on the leader ({leader.name}): {bad[leader.name].reason}")
        if not bad:
            return route
        for name, r in bad.items():
            run.fail(name, r.reason)
        route = [(n, w) for n, w in route if n.name not in bad]
    return route


def head(run: CopyRun, first: Node, union: list[str], pass_no: int) -> tuple[list[str], bytes]:
    """The chain's head and its stdin: the source relay, on the leader (through ssh, taking the
    link its dialer opened) or here (dialing the first hop itself)."""
    if run.from_local:
        forward = run.transport.argv(run.cluster.name, first, chain.relay_command(sdir(run, first.name, pass_no)))
        args = chain.source_args(run.src_dir, union, run.stream_algo, forward=forward)
        return [sys.executable, "-"], program_text("relay", args)
    args = chain.source_args(run.src_dir, union, run.stream_algo, sdir=sdir(run, "source", pass_no))
    return (run.transport.argv(run.cluster.name, run.cluster.leader, chain.source_command(args["sdir"])),
            program_text("relay", args))


def abort(run: CopyRun, nodes: list[Node], pass_no: int | None = None) -> None:
    """Stop this run's stations (of one pass, or all) on the nodes; best effort."""
    unique = list({n.name: n for n in nodes}.values())
    try:
        run_on_nodes(run.session, unique, chain.abort_command(run.run_id, pass_no), timeout=20)
    except Exception:
        pass


def finish(run: CopyRun) -> None:
    """Wait for background take-downs (a copy leaves no station behind)."""
    for worker in run.cleanups:
        worker.join(timeout=30)
    run.cleanups.clear()
