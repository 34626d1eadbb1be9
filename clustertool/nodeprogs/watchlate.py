"""Stragglers from the reduction servers' lateness records (stdlib only; a part of ``watchhub``, imported by the
control side and the tests).

Each reducer of a job writes, per CollNet session, ``~/.clustertool/jobs/<job>/stragglers/<host>.<session>.<server>
.jsonl`` on its server: one JSON line a second (and one when the session ends), its counters cumulative since the
session started (the format, version 1, written by native/src/ct_reducer_session.c)::

    {"v": 1, "t": 1795828883.86, "reducer": "server-1:0", "session": "5f3a...", "nranks": 4, "requests": 48210,
     "buckets_us": [1, 2, 4, ..., 4194304], "final": false,
     "workers": {"2": {"peer": "10.213.3.4:41234", "last": 40012, "waited_for_us": 9120331,
                       "late_sum_us": 18422011, "late_hist": [n0, n1, ..., n23]}}}

``late`` of a worker for one request (a chunk of a collective) is its arrival minus the first worker's arrival, in
µs, counted in ``late_hist[k]`` (``late <= buckets_us[k]``; the last count is everything above the last bound).
``last``: the requests where it arrived last; ``waited_for_us``: over those, its arrival minus the second-to-last
arrival (what the others spent waiting for it alone).  Workers are the session's ranks (one per node under NCCL's
CollNet), ``peer`` the address they connected from.
"""

VERSION = 1
LATE_RATIO = 4.0       # a median lateness this many times the others' median is a straggler's
LATE_FLOOR_US = 1000   # lateness below a millisecond is scheduling noise, never a straggler
COUNTS = ("last", "waited_for_us", "late_sum_us")


def valid(doc):
    """A record line this code reads (its version, and the fields it needs)."""
    return (isinstance(doc, dict) and doc.get("v") == VERSION and isinstance(doc.get("workers"), dict)
            and isinstance(doc.get("buckets_us"), list))


def merge(docs):
    """Sum records (several reducers, several sessions) per worker: {worker: {peer, requests, last, waited_for_us,
    late_sum_us, late_hist}}, and the buckets' bounds."""
    workers: dict = {}
    bounds = None
    for doc in docs:
        if not valid(doc):
            continue
        bounds = bounds or list(doc["buckets_us"])
        for key, w in doc["workers"].items():
            hist = list(w.get("late_hist") or [])
            into = workers.setdefault(str(key), {"peer": w.get("peer"), "requests": 0, "late_hist": [0] * len(hist),
                                                 **{c: 0 for c in COUNTS}})
            into["requests"] += sum(hist)
            for c in COUNTS:
                into[c] += int(w.get(c) or 0)
            if len(into["late_hist"]) < len(hist):
                into["late_hist"] += [0] * (len(hist) - len(into["late_hist"]))
            for i, n in enumerate(hist):
                into["late_hist"][i] += int(n)
    return workers, bounds or []


def minus(now, before):
    """The counts of ``now`` less ``before`` (both merge()'s workers): what happened between two readings."""
    out = {}
    for key, w in now.items():
        b = before.get(key) or {}
        hist = [n - (b.get("late_hist") or [])[i] if i < len(b.get("late_hist") or []) else n
                for i, n in enumerate(w["late_hist"])]
        out[key] = dict(w, requests=w["requests"] - int(b.get("requests") or 0), late_hist=hist,
                        **{c: w[c] - int(b.get(c) or 0) for c in COUNTS})
    return out


def quantile_us(hist, bounds, q):
    """The bucket bound where the cumulative count reaches ``q`` of the total (None: no count; the open bucket
    above the last bound reads as twice it)."""
    total = sum(hist)
    if total <= 0:
        return None
    want, seen = max(1, int(total * q + 0.999999)), 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= want:
            return bounds[i] if i < len(bounds) else 2 * (bounds[-1] if bounds else 1)
    return 2 * (bounds[-1] if bounds else 1)


def median(values):
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


def summary(workers, bounds):
    """Per worker: p50/p99 lateness, the share of requests it came last in, the time it made the others wait; a
    ``straggler`` flag (see ``flagged``); sorted by that time, most first."""
    rows = []
    for key, w in workers.items():
        n = w["requests"]
        rows.append({"worker": key, "peer": w.get("peer"), "requests": n, "last": w["last"],
                     "last_share": round(w["last"] / n, 4) if n else None, "waited_for_us": w["waited_for_us"],
                     "mean_late_us": round(w["late_sum_us"] / n, 1) if n else None,
                     "p50_us": quantile_us(w["late_hist"], bounds, 0.50),
                     "p99_us": quantile_us(w["late_hist"], bounds, 0.99)})
    marked = flagged(rows)
    for r in rows:
        r["straggler"] = r["worker"] in marked
    return sorted(rows, key=lambda r: (-r["waited_for_us"], r["worker"]))


def flagged(rows):
    """Workers that made the rest wait.  With three workers or more: a share of the others' waiting above twice
    an even share.  With two: last in three requests of four or more.  Any number: a median lateness LATE_RATIO
    times the workers' median of medians, or more (the first to arrive is 0 late: with few workers the median of
    all of them, not of the others, keeps a merely later-than-first worker from being named).  Each only where
    the lateness is LATE_FLOOR_US or more (a millisecond: below it, scheduling noise on a busy machine)."""
    n = len(rows)
    waited = sum(r["waited_for_us"] for r in rows)
    typical = median([r["p50_us"] for r in rows if r["p50_us"] is not None])
    out = set()
    for r in rows:
        each = r["waited_for_us"] / r["last"] if r["last"] else 0
        if n >= 3:
            share = waited > 0 and r["waited_for_us"] / waited > 2.0 / n and each >= LATE_FLOOR_US
        else:
            share = n == 2 and (r["last_share"] or 0) >= 0.75 and each >= LATE_FLOOR_US
        late = (r["p50_us"] is not None and r["p50_us"] >= LATE_FLOOR_US and typical is not None
                and r["p50_us"] >= LATE_RATIO * typical)
        if share or late:
            out.add(r["worker"])
    return out


def node_of(peer, nodes):
    """The node whose address a worker connected from (``nodes``: [name, address, role] rows), or None."""
    addr = (peer or "").rsplit(":", 1)[0]
    return next((name for name, address, _ in nodes if address == addr), None)
