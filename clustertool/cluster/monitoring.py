"""`monitoring enable|disable|status`: Prometheus and its exporters on a running cluster.

Every node: Prometheus's node exporter on its private address (the cluster's network only), with its
textfile collector fed by ``nodeprogs/gputext.py`` where nvidia-smi answers, or NVIDIA's dcgm-exporter where a
node has it installed (then Prometheus scrapes it as job ``dcgm``, and gputext does not run).  The leader also: the
watch hub as clustertool's own exporter (jobs, ranks' steps and step rates, stragglers, cordons, the
cost so far; on its loopback) and a Prometheus server (on its loopback) scraping them all, with a
bounded retention.  Nothing listens beyond the cluster: `metrics` reaches Prometheus through ssh.
The node side is ``nodeprogs/monitoring.sh``; every process it starts carries the mark
``CLUSTERTOOL_MONITORING=<cluster>``, which is how `disable` (and the tests' leftover check) finds them.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from clustertool import nodeprogs
from clustertool.cluster import ledger
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.watchplan import WatchRequest, hub_args
from clustertool.core import state
from clustertool.core.durations import parse_duration
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node, jsonable
from clustertool.remote.group import run_on_node, run_on_nodes

MARK_ENV = "CLUSTERTOOL_MONITORING"
PROCESSES = ("node-exporter", "gputext", "dcgm", "hub", "prometheus")
DCGM_PORT = 9400   # dcgm-exporter's own default port, on the node's private address as the node exporter's
DCGM_TARGETS = "dcgm-targets.json"   # beside prometheus.yml on the leader: the nodes whose dcgm-exporter runs
MONITORING_DIR = "~/.clustertool/monitoring"
LEGACY_FILE = "monitoring.json"  # where the setting lived before the cluster record held it (read once, then gone)


@dataclass(frozen=True)
class MonitoringRequest:
    """How the stack is set up (``enable``'s options)."""

    scrape_interval: str = "15s"
    retention_time: str = "15d"
    retention_size: str = "2GB"
    node_port: int = 9100
    exporter_port: int = 9105
    prometheus_port: int = 9090

    def __post_init__(self) -> None:
        self.interval_s  # noqa: B018  (validates)
        if not re.match(r"^[0-9]+(ms|s|m|h|d|w|y)$", self.retention_time):
            raise UsageError(f"--retention-time {self.retention_time!r}: Prometheus's form, e.g. 15d, 12h, 4w")
        if not self.retention_size[:-2].isdigit() or self.retention_size[-2:] not in ("MB", "GB", "TB"):
            raise UsageError(f"--retention-size {self.retention_size!r}: e.g. 500MB, 2GB")
        for port in (self.node_port, self.exporter_port, self.prometheus_port):
            if not 1 <= port <= 65535:
                raise UsageError(f"port {port}: expected 1-65535")

    @property
    def interval_s(self) -> int:
        return parse_duration(self.scrape_interval, "--scrape-interval")

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)

    @classmethod
    def of(cls, value: Any) -> "MonitoringRequest | None":
        """A spec's or the API's ``monitoring``: true/false, a mapping of the settings, or a request."""
        if value is None or value is False or isinstance(value, cls):
            return value or None
        if value is True:
            return cls()
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise UsageError(f"monitoring: unknown setting(s) {', '.join(map(str, unknown))}",
                                 hint="settings: scrape_interval, retention_time, retention_size")
            settings: dict[str, Any] = {k: str(v) if k in SETTING_KEYS else v for k, v in value.items()}
            return cls(**settings)
        raise UsageError(f"monitoring: expected true, false or a mapping of settings, got {value!r}")


SETTING_KEYS = ("scrape_interval", "retention_time", "retention_size")


def plan_line(request: MonitoringRequest) -> str:
    """What `up --monitoring` adds to the plan."""
    return ("monitoring: the node exporter on every node, Prometheus on the leader "
            f"(127.0.0.1:{request.prometheus_port}), scraping every {request.scrape_interval}, "
            f"keeping {request.retention_time} / {request.retention_size}")


@dataclass
class MonitoringResult:
    """Each node's processes after the command (``to_dict()`` is the --json)."""

    cluster: str
    verb: str
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> process -> "running PID" ...
    problems: list[str] = field(default_factory=list)
    prometheus: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        return dict(jsonable(self), exit_code=self.exit_code)


def prometheus_config(record: ClusterRecord, request: MonitoringRequest) -> dict[str, Any]:
    """Prometheus's configuration (JSON is YAML): every node's exporter, clustertool's, Prometheus itself."""
    every, cluster = f"{request.interval_s}s", {"cluster": record.name}
    nodes = [{"targets": [f"{n.address}:{request.node_port}"], "labels": dict(cluster, node=n.name, role=n.role)}
             for n in record.ordered_nodes()]
    return {"global": {"scrape_interval": every, "evaluation_interval": every},
            "scrape_configs": [
                {"job_name": "node", "static_configs": nodes},
                # the nodes that run dcgm-exporter are known once every node ran monitoring.sh: a file the leader
                # re-reads when it changes (relative to prometheus.yml's folder)
                {"job_name": "dcgm", "file_sd_configs": [{"files": [DCGM_TARGETS], "refresh_interval": every}]},
                {"job_name": "clustertool", "honor_labels": True,  # its node label names the node it speaks of
                 "static_configs": [{"targets": [f"127.0.0.1:{request.exporter_port}"], "labels": cluster}]},
                {"job_name": "prometheus", "static_configs": [
                    {"targets": [f"127.0.0.1:{request.prometheus_port}"],
                     "labels": dict(cluster, node=record.leader.name)}]}]}


def dcgm_targets(record: ClusterRecord, running: list[str]) -> list[dict[str, Any]]:
    """The ``dcgm`` job's targets (file_sd's form): the nodes named in ``running``, labelled as the node job's."""
    return [{"targets": [f"{n.address}:{DCGM_PORT}"],
             "labels": {"cluster": record.name, "node": n.name, "role": n.role}}
            for n in record.ordered_nodes() if n.name in running]


def write_targets_command(name: str = DCGM_TARGETS) -> str:
    """The leader's shell line that puts its stdin in place as ``name`` at once (Prometheus watches the file)."""
    path = f"{MONITORING_DIR}/{name}"
    return f"cat > {path}.tmp && mv -f {path}.tmp {path}"


def cost_args(record: ClusterRecord, now: float | None = None) -> dict[str, Any] | None:
    """What the exporter counts the cost from: the ledger's hourly price and cost until now."""
    now = time.time() if now is None else now
    mine = [c for c in ledger.summarize(ledger.read(), now=now) if c.id == record.id]
    if not mine or mine[-1].hourly is None:
        return None
    return {"hourly": mine[-1].hourly, "spent": mine[-1].cost or 0.0, "since": now}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def node_inputs(session: ClusterSession, node: Node, request: MonitoringRequest, mode: str) -> dict[str, Any]:
    """monitoring.sh's inputs for one node (the leader's carry Prometheus's config and the exporter)."""
    record = session.record
    inputs: dict[str, Any] = {"MODE": mode, "MARK": f"{MARK_ENV}={record.name}", "ADDR": node.address,
                              "NODE_PORT": request.node_port, "ROLE": "leader" if node.is_leader else node.role,
                              "PROM_PORT": request.prometheus_port, "RETENTION_TIME": request.retention_time,
                              "RETENTION_SIZE": request.retention_size, "PROM_CONFIG_B64": "", "HUB_B64": "",
                              "GPU_B64": "", "DCGM_PORT": DCGM_PORT, "DCGM_MS": 1000 * request.interval_s}
    if mode != "enable":
        return inputs
    gpu = {"dir": "~/.clustertool/monitoring/textfile", "interval": request.interval_s}
    inputs["GPU_B64"] = _b64(nodeprogs.program_text("gputext", gpu))
    if node.is_leader:
        args = hub_args(session, "serve", WatchRequest(interval=float(request.interval_s)), None)
        args.update(port=request.exporter_port, cost=cost_args(record))
        inputs["HUB_B64"] = _b64(nodeprogs.program_text("watchhub", args))
        inputs["PROM_CONFIG_B64"] = _b64(json.dumps(prometheus_config(record, request), indent=1).encode())
    return inputs


def parse_lines(text: str) -> tuple[dict[str, str], list[str]]:
    """monitoring.sh's lines: (process -> state, problems)."""
    procs: dict[str, str] = {}
    problems = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        name, _, detail = rest.partition(" ")
        if word in ("running", "stopped", "skipped") and not procs.get(name, "").startswith("skipped"):
            procs[name] = f"{word} {detail}".strip()
        elif word in ("missing", "failed"):
            procs[name] = word
            problems.append(f"{name} {word}: {detail}".strip())
    return procs, problems


def _run(session: ClusterSession, verb: str, request: MonitoringRequest) -> MonitoringResult:
    record = session.ready()
    nodes = record.ordered_nodes()
    script = {n.name: nodeprogs.shell_script("monitoring", **node_inputs(session, n, request, verb)) for n in nodes}
    group = run_on_nodes(session, nodes, "sh -s", timeout=120, stdin_data=lambda n: script[n.name].encode())
    result = MonitoringResult(record.name, verb)
    for r in group.results:
        procs, problems = parse_lines(r.stdout)
        result.nodes[r.node] = procs
        result.problems += [f"{r.node}: {p}" for p in problems]
        if not r.ok:
            result.problems.append(f"{r.node}: {r.reason}")
    if verb == "enable":
        result.prometheus = f"127.0.0.1:{request.prometheus_port} on {record.leader.name} (the leader)"
        result.problems += scrape_dcgm(session, record, result)
    return result


def scrape_dcgm(session: ClusterSession, record: ClusterRecord, result: MonitoringResult) -> list[str]:
    """Tell Prometheus which nodes run dcgm-exporter (none: the leader's script left the list empty)."""
    running = [node for node, procs in result.nodes.items() if procs.get("dcgm", "").startswith("running")]
    if not running:
        return []
    data = json.dumps(dcgm_targets(record, running), indent=1).encode()
    done = run_on_node(session, record.leader, write_targets_command(), timeout=60, stdin_data=data)
    return [] if done.ok else [f"{record.leader.name}: dcgm-exporter's targets not written: {done.reason}"]


def start(session: ClusterSession, request: MonitoringRequest) -> MonitoringResult:
    """Start (or restart, with these settings) the stack on every node; the record is left as it is (lifecycle
    calls this while it holds the cluster's lock, and records the setting itself)."""
    return _run(session, "enable", request)


def enable(session: ClusterSession, request: MonitoringRequest) -> MonitoringResult:
    """`monitoring enable`: start the stack and keep its setting in the cluster's record (so `start`, `replace` and
    `recover` start it again); a stack with problems is not recorded as on."""
    result = start(session, request)
    remember(session, request if not result.problems else None)
    return result


def disable(session: ClusterSession) -> MonitoringResult:
    """Stop every process of the stack on every node (Prometheus's data stays on the leader)."""
    result = stop(session)
    remember(session, None)
    return result


def stop(session: ClusterSession) -> MonitoringResult:
    """Stop the stack, the record left as it is (lifecycle's `down` and `stop` of machines that stay)."""
    result = _run(session, "disable", setting(session.record) or MonitoringRequest())
    result.problems += [f"{node}: {p} still running" for node, procs in result.nodes.items()
                        for p, st in procs.items() if st.startswith("running")]
    return result


def status(session: ClusterSession) -> MonitoringResult:
    return _run(session, "status", setting(session.record) or MonitoringRequest())


def setting(record: ClusterRecord) -> MonitoringRequest | None:
    """The stack's setting while it is on (the cluster's record; a phase-A monitoring.json is read once)."""
    if record.monitoring is not None:
        return MonitoringRequest(**record.monitoring)
    try:
        return MonitoringRequest(**json.loads((state.cluster_dir(record.name) / LEGACY_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def status_extra(record: ClusterRecord) -> dict[str, str]:
    """`status`'s line while the stack is on (from the record: no node is asked)."""
    on = setting(record)
    if on is None or not record.nodes:
        return {}
    return {"monitoring": f"on: Prometheus on {record.leader.name} (127.0.0.1:{on.prometheus_port}), every "
                          f"{on.scrape_interval}, keeping {on.retention_time} / {on.retention_size}; "
                          f"`clustertool metrics -c {record.name}` reaches it"}


def remember(session: ClusterSession, request: MonitoringRequest | None) -> None:
    """Record the setting (None: off) in the cluster's record, under its lock."""
    value = request.to_dict() if request is not None else None
    with session.locked(purpose="monitoring") as record:
        record.monitoring = value
        state.save(record)
    session.record.monitoring = value
    (state.cluster_dir(session.name) / LEGACY_FILE).unlink(missing_ok=True)


def restart_lines(session: ClusterSession, what: str) -> list[str]:
    """After `start`, `replace` or `recover` (lock held by the caller): the stack again where the record says it
    was on; one line per problem (the lifecycle verb goes on: monitoring never fails it)."""
    request = setting(session.record)
    if request is None:
        return []
    result = start(session, request)
    return [f"monitoring ({what}): {p}" for p in result.problems] or [f"monitoring: started again after {what}"]


def stop_lines(session: ClusterSession, owned: bool) -> list[str]:
    """Before `down`/`stop` (lock held): machines that stay (static, adopted) get their stack stopped, best effort;
    machines the provider stops or removes take the processes with them."""
    if owned or setting(session.record) is None:
        return []
    try:
        result = stop(session)
    except Exception as exc:  # never fails the teardown
        return [f"monitoring: could not stop the stack: {exc}"]
    return [f"monitoring: {p}" for p in result.problems] or ["monitoring: stopped on every node"]
