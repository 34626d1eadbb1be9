"""PyTorch's Flight Recorder of every rank, folded: where each rank is in its collectives (pure).

Each rank's summary (nodeprogs/flightrec.py) says, per process group, the last collective it enqueued, started
and completed, and its last few collectives.  In a hang the ranks that called the collective the others wait in
are at the same sequence number; a rank behind them never called it (it is elsewhere: its Python stack says
where), and ranks whose collective at the same number differs (another operation) posted collectives in another
order.  Ranks without a record say why, once per reason.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

from clustertool.core import nodeset


class Ranked(Protocol):
    rank: int
    node: str
    method: str
    flight: dict[str, Any] | None


def fold_ranks(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and runs[-1][-1] == r - 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def label(stacks: Sequence[Ranked]) -> str:
    ranks = [s.rank for s in stacks]
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {fold_ranks(ranks)} ({nodeset.fold(sorted({s.node for s in stacks}))})"


def _op(stack: Ranked, pg: str, seq: int) -> str | None:
    assert stack.flight is not None
    return next((e["op"] for e in reversed(stack.flight.get("last") or [])
                 if e.get("pg") == pg and e.get("seq") == seq and not e.get("p2p")), None)


def _where(stacks: Sequence[Ranked], pg: str, key: str) -> dict[int, int]:
    return {s.rank: int(((s.flight or {}).get("pgs") or {}).get(pg, {}).get(key) or -1) for s in stacks}


def group_lines(stacks: Sequence[Ranked], pg: str) -> list[str]:
    """One process group: who waits in which collective, who never called it, who called another one."""
    enqueued, completed = _where(stacks, pg, "enqueued"), _where(stacks, pg, "completed")
    top = max(enqueued.values())
    if top < 0:
        return []
    ahead = [s for s in stacks if enqueued[s.rank] == top]
    op = next((o for o in (_op(s, pg, top) for s in ahead) if o), "?")
    waiting = [s for s in ahead if completed[s.rank] < top]
    where = f"process group {pg}" if pg != "0" else "the default process group"
    lines = []
    behind = sorted({enqueued[s.rank] for s in stacks} - {top}, reverse=True)
    if behind:
        verb = "wait in" if waiting else "completed"
        lines.append(f"{where}: {label(ahead)} {verb} collective #{top} ({op})")
        for seq in behind:
            late = [s for s in stacks if enqueued[s.rank] == seq]
            last = "no collective yet" if seq < 0 else f"#{seq} ({_op(late[0], pg, seq) or '?'})"
            lines.append(f"{where}: {label(late)} never called #{top}: its last collective is {last}; its stack "
                         "says where it is")
    elif waiting:
        lines.append(f"{where}: every rank is in collective #{top} ({op}), none completed it (a peer outside "
                     "these ranks, or the network)" if len(waiting) == len(stacks)
                     else f"{where}: every rank called collective #{top} ({op}); {label(waiting)} still wait in it")
    else:
        lines.append(f"{where}: every rank completed collective #{top} ({op}): none is inside a collective")
    return lines + mismatch_lines(stacks, pg, where)


def mismatch_lines(stacks: Sequence[Ranked], pg: str, where: str) -> list[str]:
    """A collective number the ranks' records share, with different operations: the first one."""
    seqs = sorted({e["seq"] for s in stacks for e in (s.flight or {}).get("last") or []
                   if e.get("pg") == pg and not e.get("p2p") and e.get("seq") is not None})
    for seq in seqs:
        ops: dict[str, list[Ranked]] = {}
        for s in stacks:
            op = _op(s, pg, seq)
            if op is not None:
                ops.setdefault(op, []).append(s)
        if len(ops) > 1:
            said = "; ".join(f"{label(members)} {op}"
                             for op, members in sorted(ops.items(), key=lambda kv: -len(kv[1])))
            return [f"{where}: collective #{seq} differs: {said} (collectives called in a different order)"]
    return []


def fold(stacks: Sequence[Ranked]) -> list[str]:
    """Lines for `stacks` (and the hang check's saved stacks): the recorded ranks folded, then the others' reasons."""
    alive = [s for s in stacks if s.method != "gone"]
    ok = [s for s in alive if (s.flight or {}).get("status") == "ok"]
    lines = []
    if ok:
        first = ok[0].flight or {}
        head = f"Flight Recorder ({first.get('backend') or '?'}, torch {first.get('torch') or '?'})"
        pgs = sorted({pg for s in ok for pg in ((s.flight or {}).get("pgs") or {})}, key=lambda p: (len(p), p))
        lines += [f"{head}: {line}" for pg in pgs for line in group_lines(ok, pg)]
    why: dict[str, list[Ranked]] = {}
    for s in alive:
        if s not in ok and s.flight is not None:  # None: a stacks program from before the Flight Recorder
            why.setdefault(s.flight.get("why") or "no record", []).append(s)
    lines += [f"Flight Recorder: {label(members)}: {reason}" for reason, members in why.items()]
    return lines
