"""The slow node or link, found in a few rounds of pairs (pure: measurements in, verdicts out).

Each round is a perfect matching: every node in one pair (with an odd count one sits out, a
different one each time), all pairs measured at the same time.  Each measurement gives the
pair's bandwidth (the slower direction) and round-trip time.  After a round the next matching
is chosen from what was found:

* a pair below the threshold makes both ends suspects; each is paired next with a node already
  seen at full rate.  A node slow with every partner, two of them known good, is named as the
  node.  Two nodes each at full rate elsewhere but slow together make the pair a link suspect,
  measured again; slow twice, the link is named.
* the remaining nodes meet partners they have not met yet (more links covered).
* once everything named is settled, one more round confirms: each named node meets another good
  partner, each named link is measured again; what that round contradicts is not named.

A pair is slow for bandwidth below ``threshold`` x the reference (the median over nodes of each
node's best figure: a slow node or link drags only its own pairs down) and below the expected
rate where one is known; for latency above reference / ``threshold`` and more than
``rtt_floor_s`` above it.  Each of its measurements must also be slow against the median of its
own round (rounds of ``ROUND_MIN_PAIRS`` pairs or more): pairs measured at the same moment share
the moment's conditions, so a round in which everything ran slower (other traffic, a CPU-starved
host running iperf3) names nothing, where the reference, taken over every round, would have.
A clean cluster gets the whole budget of rounds (more links measured);
the budget is ceil(log2(n)) + 1 rounds, against the n - 1 rounds of measuring every pair.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

DEFAULT_THRESHOLD = 0.8
RTT_FLOOR_S = 0.001  # a latency difference under 1 ms is not a finding (in-AZ TCP RTT is ~0.05-0.3 ms)
ROUND_MIN_PAIRS = 3  # a round's median is its pairs' common figure from 3 pairs on (of 2 it is their mean)
METRICS = ("bandwidth", "latency")

Pair = tuple[str, str]


@dataclass
class Measurement:
    round: int
    a: str
    b: str
    bits_per_s: float | None  # None: the bandwidth test failed (``error`` says why)
    rtt_s: float | None  # None: the round trip failed
    error: str = ""

    @property
    def pair(self) -> Pair:
        return key(self.a, self.b)


def key(a: str, b: str) -> Pair:
    return (a, b) if a <= b else (b, a)


def max_rounds(n: int) -> int:
    """The search's budget: ceil(log2(n)) + 1 rounds (0 below two nodes)."""
    return math.ceil(math.log2(n)) + 1 if n >= 2 else 0


def round_robin(nodes: Sequence[str]) -> list[list[Pair]]:
    """Every pair once, in rounds of disjoint pairs (the circle method): n - 1 rounds (n when odd)."""
    ring = list(nodes) + ([None] if len(nodes) % 2 else [])  # None: the one who sits out
    m = len(ring)
    out = []
    for _ in range(m - 1):
        pairs = [(ring[i], ring[m - 1 - i]) for i in range(m // 2)]
        out.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


@dataclass
class Assessment:
    """What the measurements so far say, per metric."""

    nodes: list[str]
    reference: dict[str, float | None]  # metric -> the cluster's figure (bits/s, seconds)
    value: dict[str, dict[Pair, float]]  # metric -> pair -> its best figure
    slow: dict[str, set[Pair]]
    good: dict[str, set[str]]  # nodes with at least one pair not slow
    named_nodes: dict[str, dict[str, list[str]]]  # metric -> node -> its partners (all slow)
    named_links: dict[str, set[Pair]]
    node_suspects: dict[str, dict[str, list[str]]]  # all pairs slow, fewer than two good partners
    link_suspects: dict[str, set[Pair]]  # slow once, both ends good elsewhere
    partners: dict[str, set[str]]
    counts: Counter

    @property
    def suspects(self) -> set[str]:
        return {n for m in METRICS for n in self.node_suspects[m]}

    @property
    def pending_links(self) -> set[Pair]:
        return {p for m in METRICS for p in self.link_suspects[m]}

    @property
    def named(self) -> bool:
        return any(self.named_nodes[m] or self.named_links[m] for m in METRICS)

    def healthy(self) -> set[str]:
        """Nodes good in every metric and suspect in none: the partners suspects are paired with."""
        named = {n for m in METRICS for n in self.named_nodes[m]}
        return set.intersection(*(self.good[m] for m in METRICS)) - self.suspects - named


def _figures(measurements: Sequence[Measurement]) -> tuple[dict[str, dict[Pair, float]], Counter]:
    """Each pair's best figure over its measurements (a failure counts as 0 bits/s, infinite RTT)."""
    value: dict[str, dict[Pair, float]] = {"bandwidth": {}, "latency": {}}
    counts: Counter = Counter()
    for m in measurements:
        p = m.pair
        counts[p] += 1
        bw = m.bits_per_s if m.bits_per_s is not None else 0.0
        rtt = m.rtt_s if m.rtt_s is not None else math.inf
        value["bandwidth"][p] = max(bw, value["bandwidth"].get(p, 0.0))
        value["latency"][p] = min(rtt, value["latency"].get(p, math.inf))
    return value, counts


def _reference(metric: str, values: dict[Pair, float]) -> float | None:
    best: dict[str, float] = {}
    pick = max if metric == "bandwidth" else min
    for (a, b), v in values.items():
        for n in (a, b):
            best[n] = pick(v, best[n]) if n in best else v
    finite = [v for v in best.values() if math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _figure(metric: str, m: Measurement) -> float:
    if metric == "bandwidth":
        return m.bits_per_s if m.bits_per_s is not None else 0.0
    return m.rtt_s if m.rtt_s is not None else math.inf


def _round_references(measurements: Sequence[Measurement]) -> dict[str, dict[int, float]]:
    """Metric -> round -> the median of the pairs measured in that round, for rounds of ``ROUND_MIN_PAIRS``
    pairs or more whose median is a figure (not a failure)."""
    by_round: dict[int, list[Measurement]] = {}
    for m in measurements:
        by_round.setdefault(m.round, []).append(m)
    out: dict[str, dict[int, float]] = {metric: {} for metric in METRICS}
    for r, got in by_round.items():
        if len(got) < ROUND_MIN_PAIRS:
            continue
        for metric in METRICS:
            median = statistics.median(_figure(metric, m) for m in got)
            if 0 < median < math.inf:
                out[metric][r] = median
    return out


def _slow_in_its_rounds(metric: str, pair: Pair, measurements: Sequence[Measurement], rounds: dict[int, float],
                        threshold: float, rtt_floor_s: float) -> bool:
    """Whether every measurement of ``pair`` is slow against its own round's median (where it has one)."""
    return all(_is_slow(metric, _figure(metric, m), rounds[m.round], threshold, None, rtt_floor_s)
               for m in measurements if m.pair == pair and m.round in rounds)


def _is_slow(metric: str, v: float, ref: float | None, threshold: float, expected: float | None,
             rtt_floor_s: float) -> bool:
    if ref is None:
        return metric == "latency" and not math.isfinite(v)
    if metric == "bandwidth":
        return v < threshold * ref and (expected is None or v < expected)
    return v > ref / threshold and v - ref > rtt_floor_s


def assess(nodes: Sequence[str], measurements: Sequence[Measurement], *, threshold: float = DEFAULT_THRESHOLD,
           expected_bits: float | None = None, rtt_floor_s: float = RTT_FLOOR_S) -> Assessment:
    value, counts = _figures(measurements)
    partners: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in counts:
        partners[a].add(b)
        partners[b].add(a)
    out = Assessment(list(nodes), {}, value, {}, {}, {}, {}, {}, {}, partners, counts)
    order = {n: i for i, n in enumerate(nodes)}
    rounds = _round_references(measurements)
    for metric in METRICS:
        ref = _reference(metric, value[metric])
        slow = {p for p, v in value[metric].items()
                if _is_slow(metric, v, ref, threshold, expected_bits if metric == "bandwidth" else None, rtt_floor_s)
                and _slow_in_its_rounds(metric, p, measurements, rounds[metric], threshold, rtt_floor_s)}
        good = {n for p in value[metric] if p not in slow for n in p}
        named: dict[str, list[str]] = {}
        suspects: dict[str, list[str]] = {}
        for n in nodes:
            mine = [p for p in value[metric] if n in p]
            if mine and all(p in slow for p in mine):
                others = sorted((b if a == n else a for a, b in mine), key=order.__getitem__)
                (named if len([o for o in others if o in good]) >= 2 else suspects)[n] = others
        links = {p for p in slow if p[0] in good and p[1] in good}
        out.reference[metric], out.slow[metric], out.good[metric] = ref, slow, good
        out.named_nodes[metric], out.node_suspects[metric] = named, suspects
        out.named_links[metric] = {p for p in links if counts[p] >= 2}
        out.link_suspects[metric] = {p for p in links if counts[p] < 2}
    return out


def _coverage_done(a: Assessment) -> bool:
    want = min(2, len(a.nodes) - 1)
    return all(len(a.partners[n]) >= want for n in a.nodes)


def _sit_out(a: Assessment, busy: set[str], sat_out: Counter, last_out: str | None) -> str:
    """With an odd count, who rests this round: never the one who rested last round, a node the round
    needs only when no other can; else the best-covered node that rested least."""
    order = {n: i for i, n in enumerate(a.nodes)}
    pool = ([n for n in a.nodes if n not in busy and n != last_out] or [n for n in a.nodes if n != last_out]
            or list(a.nodes))
    return max(pool, key=lambda n: (len(a.partners[n]), -sat_out[n], -order[n]))


def next_matching(a: Assessment, sat_out: Counter, confirm: bool = False, last_out: str | None = None) -> list[Pair]:
    """The next round's pairs: link suspects measured again, each suspect node with a fresh healthy
    partner, the rest with partners they have not met (fewest partners first); ``confirm``: named
    nodes get a fresh healthy partner and named links are measured again.  With an odd count one
    node rests (counted in ``sat_out``), never ``last_out`` (the one that rested last round)."""
    used: set[str] = set()
    pairs: list[Pair] = []
    order = {n: i for i, n in enumerate(a.nodes)}
    healthy = a.healthy()

    def take(x: str, y: str) -> None:
        pairs.append((x, y))
        used.update((x, y))

    links = sorted(a.pending_links | ({p for m in METRICS for p in a.named_links[m]} if confirm else set()))
    needy = sorted(a.suspects | ({n for m in METRICS for n in a.named_nodes[m]} if confirm else set()),
                   key=lambda n: (len(a.partners[n]), order[n]))
    if len(a.nodes) % 2:
        out = _sit_out(a, {n for p in links for n in p} | set(needy), sat_out, last_out)
        used.add(out)
        sat_out[out] += 1
    for x, y in links:
        if x not in used and y not in used:
            take(x, y)
    for x in needy:
        if x in used:
            continue
        free = [y for y in a.nodes if y not in used and y != x]
        fresh = [y for y in free if y not in a.partners[x]]
        choice = ([y for y in fresh if y in healthy] or [y for y in fresh if y not in needy] or fresh
                  or [y for y in free if y in healthy])
        if choice:
            take(x, min(choice, key=lambda y: (len(a.partners[y]), sat_out[y], order[y])))
    for x, y in _pair_up([n for n in a.nodes if n not in used], a.partners, order):
        take(x, y)
    return pairs


def _pair_up(rest: list[str], partners: dict[str, set[str]], order: dict[str, int],
             limit: int = 20000) -> list[Pair]:
    """A perfect matching of ``rest`` (an even count) in pairs not measured yet where one exists
    (depth-first, the node with the fewest fresh partners first, within ``limit`` steps); else
    greedily, fresh partners first."""
    steps = 0

    def fresh(x: str, left: list[str]) -> list[str]:
        return sorted((y for y in left if y != x and y not in partners[x]), key=lambda y: (len(partners[y]), order[y]))

    def dfs(left: list[str]) -> list[Pair] | None:
        nonlocal steps
        if not left:
            return []
        steps += 1
        if steps > limit:
            return None
        x = min(left, key=lambda n: (len(fresh(n, left)), len(partners[n]), order[n]))
        for y in fresh(x, left):
            sub = dfs([n for n in left if n not in (x, y)])
            if sub is not None:
                return [(x, y), *sub]
        return None

    found = dfs(rest)
    if found is not None:
        return found
    left = sorted(rest, key=lambda n: (len(partners[n]), order[n]))
    out = []
    while left:
        x = left.pop(0)
        y = (fresh(x, left) or left)[0]
        left.remove(y)
        out.append((x, y))
    return out


@dataclass
class SearchResult:
    measurements: list[Measurement]
    rounds: int
    max_rounds: int
    assessment: Assessment
    confirmed: bool  # a round after the naming agreed with it
    all_pairs: bool = False
    matchings: list[list[Pair]] = field(default_factory=list)


Measure = Callable[[int, list[Pair]], list[Measurement]]


def search(nodes: Sequence[str], measure: Measure, *, threshold: float = DEFAULT_THRESHOLD,
           expected_bits: float | None = None, rtt_floor_s: float = RTT_FLOOR_S, rounds: int | None = None,
           all_pairs: bool = False, on_round: Callable[[int, list[Measurement]], None] | None = None) -> SearchResult:
    """Run the rounds: ``measure(round, pairs)`` measures the pairs of one round at the same time.

    ``all_pairs``: every pair instead (the n - 1 rounds of round_robin), for full link coverage.
    """
    nodes = list(nodes)
    budget = max_rounds(len(nodes)) if rounds is None else rounds
    plan = round_robin(nodes) if all_pairs else None
    done: list[Measurement] = []
    matchings: list[list[Pair]] = []
    sat_out: Counter = Counter()
    last_out: str | None = None
    a = assess(nodes, done, threshold=threshold, expected_bits=expected_bits, rtt_floor_s=rtt_floor_s)
    confirm_round: int | None = None
    while len(nodes) >= 2:
        r = len(matchings) + 1
        if plan is not None:
            if r > len(plan):
                break
            pairs = plan[r - 1]
        else:
            if r > budget:
                break
            settled = r > 1 and not a.suspects and not a.pending_links and _coverage_done(a)
            if settled and a.named and confirm_round is not None:
                break  # named, then confirmed by a round after
            confirming = settled and a.named
            pairs = next_matching(a, sat_out, confirm=confirming, last_out=last_out)
            if confirming:
                confirm_round = r
        rested = set(nodes) - {x for p in pairs for x in p}
        last_out = rested.pop() if len(rested) == 1 else None
        got = measure(r, pairs)
        done += got
        matchings.append(pairs)
        if on_round:
            on_round(r, got)
        a = assess(nodes, done, threshold=threshold, expected_bits=expected_bits, rtt_floor_s=rtt_floor_s)
        if confirm_round is not None and not a.named:
            confirm_round = None  # the confirming round contradicted the naming: nothing to confirm
    return SearchResult(done, len(matchings), budget if plan is None else len(plan), a,
                        confirmed=confirm_round is not None and a.named, all_pairs=all_pairs, matchings=matchings)

