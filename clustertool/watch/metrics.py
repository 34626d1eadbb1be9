"""`metrics`: Prometheus on the leader, reached from this machine only through ssh.

``forward`` opens ``ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:PROM`` to the leader (Prometheus listens on the
leader's loopback, so nothing but this tunnel reaches it) and waits until Prometheus answers through it;
``query`` asks it one instant query on the leader itself (``nodeprogs/promquery.py``) and returns its
answer as data.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustertool import nodeprogs
from clustertool.cluster.monitoring import MonitoringRequest, setting
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import RemoteError, StateError, UsageError
from clustertool.remote.group import run_on_node
from clustertool.remote.transport import stop_process

READY_TIMEOUT = 30.0


DASHBOARD = Path(__file__).resolve().parent / "grafana-dashboard.json"


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard that ships with the package (import it with your Prometheus as its source)."""
    return dict(json.loads(DASHBOARD.read_text()))


def prometheus_port(session: ClusterSession) -> int:
    on = setting(session.record)
    if on is None:
        raise StateError(f"monitoring is not enabled on {session.name}",
                         hint=f"clustertool monitoring enable -c {session.name} (or `up --monitoring`)")
    return on.prometheus_port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forward_argv(session: ClusterSession, local_port: int, remote_port: int) -> list[str]:
    """ssh that only forwards 127.0.0.1:local_port here to the leader's 127.0.0.1:remote_port, on a connection
    of its own (``ControlPath none``: a forward asked of the shared master would outlive this process)."""
    extra = ["-N", "-o", "ControlPath=none", "-o", "ExitOnForwardFailure=yes",
             "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}"]
    return session.argv(session.record.leader, None, extra=extra)


@dataclass
class Forward:
    """The tunnel: its local URL and the ssh process holding it."""

    url: str
    proc: subprocess.Popen

    def close(self) -> None:
        if self.proc.poll() is None:
            stop_process(self.proc)
            self.proc.wait()


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def forward(session: ClusterSession, local_port: int | None = None) -> Forward:
    """Open the tunnel and wait until Prometheus answers through it."""
    session.ready()
    remote = prometheus_port(session)
    port = local_port or free_port()
    proc = subprocess.Popen(forward_argv(session, port, remote), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    tunnel = Forward(f"http://127.0.0.1:{port}", proc)
    deadline = time.monotonic() + READY_TIMEOUT
    while not ready(tunnel.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            gone = proc.stderr is not None and proc.poll() is not None
            err = proc.stderr.read().decode("utf-8", "replace").strip() if gone and proc.stderr else ""
            tunnel.close()
            raise RemoteError(f"Prometheus did not answer through ssh on {tunnel.url}"
                              + (f": {err.splitlines()[-1]}" if err else ""),
                              hint=f"`clustertool monitoring status -c {session.name}` shows what runs")
        time.sleep(0.3)
    return tunnel


def query(session: ClusterSession, expr: str, timeout: float = 30.0) -> dict[str, Any]:
    """One instant query, asked on the leader: Prometheus's ``data`` ({resultType, result})."""
    if not expr.strip():
        raise UsageError("an empty query", hint="e.g. clustertool metrics query 'up'")
    record = session.ready()
    port = (setting(record) or MonitoringRequest()).prometheus_port
    program = nodeprogs.program_text("promquery", {"port": port, "query": expr, "timeout": timeout})
    r = run_on_node(session, record.leader, nodeprogs.python_command(), stdin_data=program, timeout=timeout + 10)
    try:
        answer = json.loads(r.stdout) if r.stdout.strip() else None
    except ValueError:
        answer = None
    if answer is None:
        raise RemoteError(f"Prometheus on {record.leader.name}: {r.reason or 'no answer'}",
                          hint=f"is monitoring enabled? `clustertool monitoring status -c {session.name}`")
    if answer.get("status") != "success":
        raise UsageError(f"query {expr!r}: {answer.get('errorType', 'error')}: {answer.get('error', '?')}")
    return dict(answer["data"])


def rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(series, value) per result of an instant query, series as name{label="v",...}."""
    out = []
    kind, result = data.get("resultType"), data.get("result") or []
    if kind in ("scalar", "string"):
        return [("", str(result[1]))]
    for item in result:
        labels = dict(item.get("metric") or {})
        name = labels.pop("__name__", "")
        text = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
        value = item.get("value") or (item.get("values") or [[None, ""]])[-1]
        out.append((text or "{}", str(value[1])))
    return out
