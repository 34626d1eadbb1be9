"""What the watch hub makes of the nodes' samples (stdlib only): the view, its outliers, its metrics.

A part of the node program ``watchhub`` (sent before watchhub.py) and imported here by the control
side and the tests.  A view is one reading of the whole cluster: every node (CPU, memory, network,
disk, GPUs, cordoned, reachable) and every watched job's ranks (step, step rate, step time, last
output age).  Outliers: a node whose transmit or receive rate is more than RATIO from the nodes'
median, or a rank whose step time is more than RATIO the ranks' median, for STREAK readings in a row
(at least MIN_PEERS of them to compare; a network below NET_FLOOR bytes/s is idle, not slow).
"""

import math

if "summary" not in globals():  # imported (tests, the control side); on the leader the part comes first
    from clustertool.nodeprogs.watchlate import merge, minus, node_of, summary

RATIO = 1.25
STREAK = 3
MIN_PEERS = 3
NET_FLOOR = 125_000  # 1 Mbit/s
STALL_MIN_S = 30.0   # a rank silent this long (and 5 step times) is stalled
SLOWEST = 3


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


class Streaks:
    """How many readings in a row each key has been off; flagged from STREAK on."""

    def __init__(self, need=STREAK):
        self.need, self.count = need, {}

    def update(self, key, off):
        self.count[key] = self.count.get(key, 0) + 1 if off else 0
        return self.count[key] >= self.need

    def forget_except(self, keys):
        for key in [k for k in self.count if k not in keys]:
            del self.count[key]


def off_median(values, ratio=RATIO, both_ways=True, floor=0.0):
    """{key: value / median} for keys more than ``ratio`` from the median (both ways, or above only)."""
    known = {k: v for k, v in values.items() if v is not None}
    m = median(known.values())
    if len(known) < MIN_PEERS or not m or m < floor:
        return {}
    out = {}
    for key, v in known.items():
        r = v / m
        if r > ratio or (both_ways and r < 1.0 / ratio and max(v, m) >= floor):
            out[key] = r
    return out


# ---- nodes ---------------------------------------------------------------------------------

def gpu_summary(gpus):
    """Mean utilisation (%) of a node's GPUs, or None (no GPU, or not known)."""
    if not isinstance(gpus, list) or not gpus:
        return None
    util = [g.get("util") for g in gpus if g.get("util") is not None]
    return round(sum(util) / len(util), 1) if util else None


def node_rows(nodes, samples, cordoned, link_bps, now_mono, interval):
    """One row per node from its latest sample (``samples``: name -> (sample, monotonic time seen, state, error))."""
    rows = []
    for name, address, role in nodes:
        sample, seen, state, error = samples.get(name, (None, None, "starting", None))
        row = {"name": name, "address": address, "role": role, "cordoned": name in cordoned, "state": state,
               "error": error, "age": None if seen is None else round(now_mono - seen, 1)}
        if sample is not None:
            if state == "ok" and seen is not None and now_mono - seen > 3 * interval + 2:
                row["state"] = "stale"
            for key in ("cpu", "ncpu", "cpu_of", "mem_used", "mem_total", "rx", "tx", "disk", "gpus", "self_cpu_s"):
                row[key] = sample.get(key)
            row["gpu_util"] = gpu_summary(sample.get("gpus"))
            row["link_bps"], row["link_source"] = (link_bps, "recorded") if link_bps else (sample.get("link_bps"),
                                                                                        "kernel")
            if not row["link_bps"]:
                row["link_source"] = None
        rows.append(row)
    return rows


def mark_network(rows, streaks):
    """Set each row's ``net_ratio`` ({tx, rx}: off the median) and ``net_outlier`` (directions off STREAK times)."""
    live = [r for r in rows if r.get("state") == "ok"]
    ratios = {d: off_median({r["name"]: r.get(d) for r in live}, floor=NET_FLOOR) for d in ("tx", "rx")}
    for row in rows:
        row["net_ratio"] = {d: round(ratios[d][row["name"]], 2) for d in ("tx", "rx") if row["name"] in ratios[d]}
        row["net_outlier"] = [d for d in ("tx", "rx")
                              if streaks.update(("net", row["name"], d), row["name"] in ratios[d])]


# ---- jobs ----------------------------------------------------------------------------------

def rank_rows(job_id, samples):
    """Every rank of the job that some node's sample shows, with its node."""
    rows = []
    for name, (sample, _, _, _) in samples.items():
        ranks = ((sample or {}).get("jobs") or {}).get(job_id) or {}
        for rank, info in ranks.items():
            rows.append(dict(info, rank=int(rank), node=name))
    return sorted(rows, key=lambda r: r["rank"])


def job_view(job, samples, streaks, late=None, nodes=()):
    """A watched job: its ranks with ``ratio`` (step time / median), ``outlier``, ``stalled``; the slowest; and
    ``stragglers`` from its reducers' records where there are any (``late``: the hub's memory of them)."""
    ranks = rank_rows(job["id"], samples)
    times = {r["rank"]: r.get("step_time") for r in ranks}
    off = off_median(times, both_ways=False)
    m = median(times.values())
    for r in ranks:
        st = r.get("step_time")
        r["ratio"] = round(st / m, 2) if st and m else None
        r["stalled"] = bool(not r.get("ended") and r.get("age") is not None
                            and r["age"] > max(STALL_MIN_S, 5 * (st or 0)))
        r["outlier"] = streaks.update(("rank", job["id"], r["rank"]), r["rank"] in off or r["stalled"])
    known = [r for r in ranks if r.get("step_time") is not None]
    slowest = sorted(known, key=lambda r: -r["step_time"])[:SLOWEST] if len(known) > 1 else []
    rates = [r.get("rate") for r in ranks]
    out = dict(job, ranks=ranks, median_step_time=m, median_rate=median(rates),
               slowest=[r["rank"] for r in slowest], outliers=[r["rank"] for r in ranks if r["outlier"]])
    stragglers = lateness(job["id"], samples, streaks, {} if late is None else late, nodes)
    if stragglers is not None:
        out["stragglers"] = stragglers
        by_node: dict = {}
        for w in stragglers["workers"]:
            if w.get("node") and w.get("p99_us") is not None:
                by_node[w["node"]] = max(by_node.get(w["node"], 0), w["p99_us"])
        for r in ranks:
            r["late_p99_us"] = by_node.get(r["node"])
    return out


def lateness(job_id, samples, streaks, late, nodes):
    """The reducers' records of the job merged: per worker (its node, p50/p99 lateness over the job, the share of
    requests it came last in, how long it made the others wait) and ``now``, the same since the previous reading
    (None: no new line since).  ``flagged``: a straggler over the job so far, or since the previous reading for
    STREAK readings with new lines in a row.  None: the job has no record."""
    docs = [doc for sample, _, _, _ in samples.values()
            for doc in (((sample or {}).get("stragglers") or {}).get(job_id) or {}).values()]
    if not docs:
        return None
    workers, bounds = merge(docs)
    before = late.get(job_id)
    late[job_id] = workers
    now = {w["worker"]: w for w in summary(minus(workers, before), bounds)} if before else {}
    rows = summary(workers, bounds)
    for row in rows:
        row["node"] = node_of(row.get("peer"), nodes)
        recent = now.get(row["worker"])
        row["now"] = None
        key = ("late", job_id, row["worker"])
        if recent is not None and recent["requests"] > 0:
            row["now"] = {k: recent[k] for k in ("requests", "p50_us", "p99_us", "last_share")}
            streaks.update(key, recent["straggler"])
        row["flagged"] = row["straggler"] or streaks.count.get(key, 0) >= streaks.need
    return {"source": "servers", "files": len(docs), "workers": rows,
            "flagged": [r["worker"] for r in rows if r["flagged"]]}


def build_view(state, samples, jobs, now, now_mono):
    """The whole reading.  ``state``: {nodes, leader, cordoned, link_bps, interval, streaks} (the hub's)."""
    rows = node_rows(state["nodes"], samples, state["cordoned"], state.get("link_bps"), now_mono, state["interval"])
    mark_network(rows, state["streaks"])
    late = state.setdefault("late", {})
    views = [job_view(j, samples, state["streaks"], late, state["nodes"]) for j in jobs]
    for job_id in [k for k in late if k not in {j["id"] for j in jobs}]:
        del late[job_id]
    keys = {("net", r["name"], d) for r in rows for d in ("tx", "rx")}
    keys |= {("rank", v["id"], r["rank"]) for v in views for r in v["ranks"]}
    keys |= {("late", v["id"], w["worker"]) for v in views for w in (v.get("stragglers") or {}).get("workers", [])}
    state["streaks"].forget_except(keys)
    return {"time": now, "leader": state["leader"], "interval": state["interval"], "nodes": rows, "jobs": views,
            "outliers": {"nodes": [r["name"] for r in rows if r["net_outlier"]],
                         "ranks": {v["id"]: v["outliers"] for v in views if v["outliers"]},
                         "late": {v["id"]: v["stragglers"]["flagged"] for v in views
                                  if (v.get("stragglers") or {}).get("flagged")}}}


# ---- a job's record (samples.jsonl beside its logs) --------------------------------------------

def record_line(view, job_id):
    """The compact line a job's record keeps per reading."""
    job = next((j for j in view["jobs"] if j["id"] == job_id), None)
    nodes = {r["name"]: [r.get("gpu_util"), r.get("cpu"), r.get("rx"), r.get("tx"), int(r["cordoned"]),
                         int(r["state"] == "ok")] for r in view["nodes"]}
    ranks = {str(r["rank"]): [r["node"], r.get("step"), r.get("rate"), r.get("step_time")]
             for r in (job or {}).get("ranks", [])}
    line = {"t": round(view["time"], 2), "nodes": nodes, "ranks": ranks,
            "out": {"ranks": (job or {}).get("outliers", []), "nodes": view["outliers"]["nodes"]}}
    late = (job or {}).get("stragglers")
    if late:  # per worker: [node, p50 µs, p99 µs, last share] over the job so far; the flagged ones
        line["late"] = {w["worker"]: [w.get("node"), w["p50_us"], w["p99_us"], w["last_share"]]
                        for w in late["workers"]}
        line["out"]["late"] = late["flagged"]
    return line


# ---- Prometheus's text format ------------------------------------------------------------------

def label_value(text):
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exposition:
    """Metrics in Prometheus's text format, each family's HELP and TYPE once, before its samples."""

    def __init__(self):
        self.families, self.order = {}, []

    def add(self, name, help_text, value, labels=None, kind="gauge"):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        if name not in self.families:
            self.families[name] = (help_text, kind, [])
            self.order.append(name)
        text = ",".join(f'{k}="{label_value(v)}"' for k, v in (labels or {}).items())
        self.families[name][2].append(f"{name}{{{text}}} {float(value)!r}" if text else f"{name} {float(value)!r}")

    def text(self):
        out = []
        for name in self.order:
            help_text, kind, lines = self.families[name]
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"] + lines
        return "\n".join(out) + "\n"


def _seconds(us):
    return None if us is None else us / 1e6


def metrics_text(view, cost=None):
    """clustertool's own metrics from a view (node exporters carry the machines' own)."""
    e = Exposition()
    for r in view["nodes"]:
        n = {"node": r["name"], "role": r["role"]}
        e.add("clustertool_node_reachable", "1 while the node's sampler answers the leader", int(r["state"] == "ok"), n)
        e.add("clustertool_node_cordoned", "1 while the node is cordoned (out of the hostfiles)", int(r["cordoned"]), n)
        for d in ("tx", "rx"):
            e.add("clustertool_node_network_outlier", "1 while the node's rate is off the nodes' median",
                  int(d in r.get("net_outlier", [])), dict(n, direction=d))
    for j in view["jobs"]:
        jl = {"job_id": j["id"], "job_name": j.get("name") or ""}
        e.add("clustertool_job_running", "1 for each running job", 1, jl)
        e.add("clustertool_job_ranks", "ranks whose output the nodes show", len(j["ranks"]), jl)
        e.add("clustertool_job_steps_per_second", "the ranks' median step rate", j.get("median_rate"), jl)
        e.add("clustertool_job_step_seconds", "the ranks' median step time", j.get("median_step_time"), jl)
        for r in j["ranks"]:
            rl = {"job_id": j["id"], "rank": str(r["rank"]), "node": r["node"]}
            e.add("clustertool_rank_step", "the last step the rank's output named", r.get("step"), rl)
            e.add("clustertool_rank_steps_per_second", "the rank's step rate", r.get("rate"), rl)
            e.add("clustertool_rank_step_seconds", "the rank's step time", r.get("step_time"), rl)
            e.add("clustertool_rank_output_age_seconds", "seconds since the rank's last output", r.get("age"), rl)
            e.add("clustertool_rank_straggler", "1 while the rank's step time is off the median (or it stalled)",
                  int(r.get("outlier", False)), rl)
        for w in (j.get("stragglers") or {}).get("workers", []):
            wl = {"job_id": j["id"], "worker": w["worker"], "node": w.get("node") or ""}
            for q in ("p50", "p99"):
                e.add(f"clustertool_worker_lateness_{q}_seconds", f"the worker's {q} arrival lateness at the reducers "
                      "(after the first worker's data), over the job", _seconds(w.get(f"{q}_us")), wl)
            e.add("clustertool_worker_last_ratio", "share of requests the worker's data came last in",
                  w.get("last_share"), wl)
            e.add("clustertool_worker_waited_for_seconds_total", "time the other workers waited for this one alone",
                  _seconds(w.get("waited_for_us")), wl, kind="counter")
            e.add("clustertool_worker_straggler", "1 while the reducers see the worker make the others wait",
                  int(w.get("flagged", False)), wl)
    if cost is not None:
        e.add("clustertool_cluster_hourly_price_dollars", "the cluster's price per hour", cost.get("hourly"))
        e.add("clustertool_cluster_cost_dollars", "what the cluster cost since it came up", cost.get("so_far"))
    return e.text()
