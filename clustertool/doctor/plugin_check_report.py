"""`plugin check`'s report: what the ranks printed, read into data (pure functions, no I/O).

GPU clusters: every rank's NCCL INFO log and the torch worker's result line, tagged by rank in
the job's output (``[1,R]<stdout>:``), become NCCL's version, the net plugin and the ABI version
NCCL took, CollNet on or the reason NCCL gave for off, the algorithm and protocol NCCL chose per
message size, busbw per size and #wrong, plus problems, each with a fix. Without GPUs: the
collnet_bench stand-in's rows (what `bench allreduce` prints) and #wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from clustertool.bench.allreduce import parse_rows
from clustertool.jobs.output import TAG_RE
from clustertool.plugin import nccl_log
from clustertool.plugin.nccl_log import NcclLog

RESULT_MARK = "ct-nccl-result "     # the rank wrapper prints the worker's JSON after it (check.RANK_SCRIPT)
NET_ABIS = "v5-v12"                 # what the plugin exports (native/README.md)
_BENCH_HEAD_RE = re.compile(r"# collnet_bench: (\d+) ranks, plugin (\S+)")
_BENCH_DEV_RE = re.compile(r"# device (\S+) speed (\d+) Mbps")
_BENCH_SERVERS_RE = re.compile(r"# reduction servers: (\S+)")
_BENCH_FELL_BACK_RE = re.compile(r"collnet_bench: asked for servers, the plugin runs (\w+).*")


@dataclass
class SizeRow:
    size: int
    algo: str            # NCCL's choice (GPU), or collnet_bench's algorithm (stand-in)
    proto: str | None    # NCCL's protocol; None for the stand-in
    time_us: float       # the slowest rank's average
    algbw: float         # GB/s
    busbw: float         # GB/s: algbw * 2(n-1)/n
    wrong: int           # elements that differ from the reference, summed over ranks


@dataclass
class Problem:
    severity: str        # error | warning | info
    message: str
    fix: str = ""


@dataclass
class NcclSummary:
    """What rank 0's NCCL said (the other ranks are checked against it)."""

    version: str | None
    network: str | None             # "Using network X"
    plugin_loaded: bool             # on every rank
    net_plugin: str | None
    net_abi: int | None
    collnet_plugin: str | None
    collnet_abi: int | None
    tuner_plugin: str | None
    tuner_abi: int | None
    fallback: str | None            # NCCL's words for using its own net instead
    collnet_on: bool
    collnet_reason: str
    plugin_algorithm: str | None = None     # the plugin's CollNet algorithm (its first-op line), if CollNet ran


@dataclass
class CheckReport:
    cluster: str
    mode: str                       # "nccl" (GPUs) or "standin" (collnet_bench, no GPU)
    note: str                       # one line: what ran and why
    nodes: list[str]
    ranks: int
    plugin: dict                    # the deploy: dest, version, sha256
    nccl: NcclSummary | None = None
    rows: list[SizeRow] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)   # the log lines that show it
    problems: list[Problem] = field(default_factory=list)
    servers: int = 0                # reduction servers in the cluster (their reducers ran with the job)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def split_ranks(output: str) -> dict[int, str]:
    """The job's tagged lines -> {rank: its text}; mpirun's own (untagged) lines under -1."""
    texts: dict[int, list[str]] = {}
    for line in output.splitlines():
        m = TAG_RE.match(line)
        rank, text = (int(m.group(2)), line[m.end():]) if m else (-1, line)
        texts.setdefault(rank, []).append(text)
    return {r: "\n".join(lines) for r, lines in sorted(texts.items())}


def result_doc(text: str) -> dict | None:
    """The worker's JSON (per size: time_us, algbw, busbw, wrong) from one rank's text."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                return json.loads(line[len(RESULT_MARK):])
            except ValueError:
                return None
    return None


def merge_sizes(docs: list[dict]) -> list[dict]:
    """Per size: the slowest rank's time (the collective ends with its last rank), #wrong summed."""
    by_size: dict[int, dict] = {}
    for doc in docs:
        for r in doc.get("results", []):
            cur = by_size.setdefault(r["size"], dict(r, wrong=0, time_us=-1.0))
            cur["wrong"] += r["wrong"]
            if r["time_us"] > cur["time_us"]:
                cur.update(time_us=r["time_us"], algbw=r["algbw"], busbw=r["busbw"])
    return [by_size[s] for s in sorted(by_size)]


def fallback_fix(log: NcclLog, dest: str) -> str:
    """What to do when NCCL ran on its own net, from the reason it gave."""
    env = (f"the ranks need `clustertool plugin env`: NCCL_NET_PLUGIN=clustertool (a name: NCCL 2.19/2.20 "
           f"take no path) and LD_LIBRARY_PATH starting with {dest}")
    why = log.no_plugin or ""
    if "unsupported" in why or "Failed to find ncclNetPlugin symbol" in why:
        wants = nccl_log.newest_net_abi(log.version)
        return (f"NCCL {log.version or '?'} found the library but no ABI version it asks for"
                f"{f' (newest v{wants})' if wants else ''}; the current build exports {NET_ABIS}: "
                "`clustertool plugin build && clustertool plugin deploy`")
    if why:
        return f"NCCL could not open libnccl-net-clustertool.so: {env}; `clustertool plugin status` shows the files"
    if log.version is None:
        return "NCCL printed no INFO lines: NCCL_DEBUG=INFO did not reach the ranks, or the program did not use NCCL"
    return (f"NCCL chose {log.network or 'another net'} (NCCL_NET, or another plugin in the ranks' "
            f"environment?): {env}")


def collnet_fix(log: NcclLog) -> str:
    """What to do about CollNet being off, in the order nccl_log.collnet_state reads the reasons."""
    if log.collnet_env is not None and log.collnet_env != 1:
        return "set NCCL_COLLNET_ENABLE=1 (`clustertool run --plugin` does; something in the ranks' environment " \
               "overrides it)"
    if log.threshold:
        return (f"CollNet needs at least NCCL_COLLNET_NODE_THRESHOLD={log.threshold[1]} nodes: run on more nodes "
                "or lower NCCL_COLLNET_NODE_THRESHOLD")
    if log.too_many_gpus:
        return "NCCL before 2.23 disables CollNet above 8 GPUs per node: use at most 8 slots per node, or NCCL 2.23+"
    if log.mismatch:
        return ("nodes see different numbers of network devices: make the nodes alike (`clustertool doctor "
                "--check sameness`), or set NCCL_IGNORE_COLLNET_MISMATCH=1")
    if log.setup_failed:
        return ("the plugin's WARN lines (below) say why CollNet could not connect: a firewall between nodes, or "
                "raise CLUSTERTOOL_CONNECT_TIMEOUT_MS")
    if log.collnet_env is None:
        return "NCCL did not log NCCL_COLLNET_ENABLE: make sure `clustertool plugin env` reaches the ranks"
    return ("the deployed plugin's CollNet devices do not pair with its net devices (builds before the pairing "
            "fix): `clustertool plugin build && clustertool plugin deploy`")


def _summary(logs: list[NcclLog], docs: list[dict]) -> NcclSummary:
    log = logs[0]
    on, why = nccl_log.collnet_state(log)
    version = log.version or next((d.get("nccl") for d in docs if d.get("nccl")), None)
    algo = next((x.plugin_algorithm for x in logs if x.plugin_algorithm), None)
    return NcclSummary(version, log.network, all(nccl_log.plugin_loaded(x) for x in logs), log.net_plugin, log.net_abi,
                       log.collnet_plugin, log.collnet_abi, log.tuner_plugin, log.tuner_abi, log.no_plugin, on, why,
                       algo)


def servers_problem(logs: list[NcclLog], servers: int) -> Problem | None:
    """The cluster has reduction servers but a rank's CollNet ran another algorithm: its servers did
    not answer and it fell back to sharded (the plugin WARNs why), or a rule picked another one."""
    other = [(i, x.plugin_algorithm) for i, x in enumerate(logs) if x.plugin_algorithm not in (None, "servers")]
    if not servers or not other:
        return None
    i, algo = other[0]
    warned = [w for x in logs for w in x.warnings if "server" in w.lower()][:1]
    return Problem("warning", f"the cluster has {servers} reduction server(s) but the plugin's CollNet ran {algo} "
                              f"(rank {i})" + (f": {warned[0]}" if warned else ""),
                   "`clustertool doctor` checks the servers (`clustertool reboot` brings a stopped one back); "
                   "a collnet_algo rule in the tuner table can also pick another algorithm for some sizes")


def _nccl_problems(logs: list[NcclLog], summary: NcclSummary, rows: list[SizeRow], dest: str) -> list[Problem]:
    out = []
    if not summary.plugin_loaded:
        i, bad = next((i, x) for i, x in enumerate(logs) if not nccl_log.plugin_loaded(x))
        why = bad.no_plugin or f"Using network {bad.network or '?'}"
        out.append(Problem("error", f"NCCL did not load the clustertool plugin on rank {i} ({why})",
                           fallback_fix(bad, dest)))
        return out
    off = [(i, x) for i, x in enumerate(logs) if not nccl_log.collnet_state(x)[0]]
    if off:
        i, log = off[0]
        out.append(Problem("warning", f"CollNet is off (rank {i}): {nccl_log.collnet_state(log)[1]}", collnet_fix(log)))
    elif rows and not nccl_log.ran_collnet(logs) and any(r.algo != "-" for r in rows):
        out.append(Problem("info", "CollNet is connected but NCCL chose another algorithm at every size",
                           "a tuner table makes NCCL pick CollNet where it is faster: `clustertool bench allreduce "
                           "--tuner-csv t.csv` then `clustertool plugin deploy --tuner-table t.csv`"))
    return out


def nccl_report(cluster: str, nodes: list[str], ranks: int, output: str, code: int | None, error: str | None,
                plugin: dict, note: str, servers: int = 0) -> CheckReport:
    """The GPU run's report from the job's whole output (every rank's NCCL log and result line)."""
    texts = split_ranks(output)
    rank_texts = [texts.get(r, "") for r in range(ranks)]
    logs = [nccl_log.parse_log(t) for t in rank_texts]
    docs = [d for d in (result_doc(t) for t in rank_texts) if d]
    choice = nccl_log.algos_by_size(logs)
    rows = [SizeRow(r["size"], *choice.get(r["size"], ("-", "-")), r["time_us"], r["algbw"], r["busbw"], r["wrong"])
            for r in merge_sizes(docs)]
    report = CheckReport(cluster, "nccl", note, nodes, ranks, plugin, rows=rows,
                         evidence=nccl_log.key_lines(rank_texts[0]) if rank_texts else [], servers=servers)
    failed = error or (f"mpirun exit {code}" if code else None) or (
        f"{ranks - len(docs)} of {ranks} rank(s) reported no result" if len(docs) < ranks else None)
    if any(log.version or log.network for log in logs):
        report.nccl = _summary(logs, docs)
        report.problems += _nccl_problems(logs, report.nccl, rows, plugin.get("dest", "?"))
        report.problems += [p for p in (servers_problem(logs, servers),) if p]
    if failed:
        warns = [w for log in logs for w in log.warnings][:3]
        report.problems.insert(0, Problem("error", f"the NCCL allreduce failed: {failed}"
                                          + (f"; NCCL WARN: {' | '.join(warns)}" if warns else ""),
                                          "`clustertool jobs` and `clustertool logs JOB` show every rank's output"))
    if report.wrong:
        report.problems.append(Problem("error", f"{report.wrong} element(s) differ from the CPU reference",
                                       "a wrong sum under NCCL with the plugin is a plugin bug: please report it "
                                       "with this output"))
    return report


def standin_report(cluster: str, nodes: list[str], output: str, code: int | None, error: str | None,
                   plugin: dict, note: str, servers: int = 0) -> CheckReport:
    """collnet_bench's table (servers, sharded, ring: the plugin's CollNet; mpi: Open MPI's allreduce).

    With reduction servers, collnet_bench stops rather than print sharded's rows as servers' when
    the servers do not answer: that is the run's error, with the plugin's WARN in the output."""
    rows = [SizeRow(r.size, r.algo, None, r.time_us, r.algbw, r.busbw, r.wrong) for r in parse_rows(output)]
    head = _BENCH_HEAD_RE.search(output)
    evidence = [m.group(0) for m in (head, _BENCH_DEV_RE.search(output), _BENCH_SERVERS_RE.search(output)) if m]
    report = CheckReport(cluster, "standin", note, nodes, int(head.group(1)) if head else len(nodes), plugin,
                         rows=rows, evidence=evidence, servers=servers)
    failed = error or (f"mpirun exit {code}" if code else None) or (None if rows else "collnet_bench printed no rows")
    fell_back = _BENCH_FELL_BACK_RE.search(output)
    if failed and fell_back:
        report.problems.append(Problem("error", f"the reduction servers did not answer: the plugin ran "
                                                f"{fell_back.group(1)} instead of servers ({failed})",
                                       "`clustertool doctor` checks the servers (`clustertool reboot` brings a "
                                       "stopped one back); `clustertool logs JOB` shows the plugin's WARN"))
    elif failed:
        report.problems.append(Problem("error", f"the collnet_bench stand-in failed: {failed}",
                                       "`clustertool logs JOB` shows its output; `clustertool doctor` checks the "
                                       "cluster"))
    if report.wrong:
        report.problems.append(Problem("error", f"{report.wrong} element(s) differ from MPI_Allreduce of the same "
                                                "inputs", "a wrong sum is a plugin bug: please report it"))
    return report
