"""How `bench scaling` starts each size's job.

Each size is a real `clustertool run` job (preflight, detached on the leader, a job record,
visible to `clustertool jobs` and stoppable by `clustertool kill`), followed to its end.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from clustertool.bench.allreduce import Row, link_ratios
from clustertool.bench.scaling import Launcher
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError
from clustertool.core.model import ClusterRecord, Node
from clustertool.jobs import kill, launch
from clustertool.jobs.follow import stream
from clustertool.jobs.jobrequests import RunRequest
from clustertool.providers.base import get_provider

OnLine = Callable[[str, str, str], None]  # (node, "stdout", line): each line of the job's output as it comes


def launcher(session: ClusterSession, *, env: Sequence[str] = (), timeout: float | None = None,
             on_line: OnLine | None = None, plugin: bool = False, launcher_name: str | None = None,
             record: Callable[[], bool] | None = None) -> Launcher:
    """Every rank also gets CLUSTERTOOL_LEADER_ADDR (e.g. for torch.distributed's MASTER_ADDR)."""
    env = [f"CLUSTERTOOL_LEADER_ADDR={session.record.leader.address}", *env]
    return jobs_launcher(session, env=env, timeout=timeout, on_line=on_line, plugin=plugin,
                         launcher_name=launcher_name, record=record)


def jobs_launcher(session: ClusterSession, *, env: Sequence[str] = (), timeout: float | None = None,
                  on_line: OnLine | None = None, plugin: bool = False, name: str | None = None,
                  launcher_name: str | None = None, record: Callable[[], bool] | None = None) -> Launcher:
    """``name``: the job's name in `clustertool jobs` (default ``scaling-<N>n``); ``launcher_name``: what
    starts the ranks (`run --launcher`; None: mpirun, or the launcher the command starts with); ``record()``:
    whether the job starts its watch recorder (default yes, as `run`).  Each job starts quietly (its progress
    lines are not the bench's), over the session's transport."""
    cluster = session.record
    session = ClusterSession(cluster, session.transport)

    def start(nodes: Sequence[Node], per_node: int | None, argv: Sequence[str]) -> tuple[int | None, str, str | None]:
        try:
            request = RunRequest.of(list(argv), nodes=",".join(n.name for n in nodes), per_node=per_node,
                                    env=list(env), launcher=launcher_name, plugin=plugin,
                                    name=name or f"scaling-{len(nodes)}n", record=record() if record else True)
            started = launch.run(session, request)
        except ToolError as exc:
            return None, "", exc.message
        lines: list[str] = []
        expired = threading.Event()

        def line(text: str) -> None:
            lines.append(text)
            if on_line is not None:
                on_line(cluster.leader.name, "stdout", text)

        def stop() -> None:
            expired.set()
            try:
                kill.kill(session, started.job.id)
            except ToolError:
                pass

        timer = threading.Timer(timeout, stop) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            code = stream(session, started.job, line)
        finally:
            if timer:
                timer.cancel()
        output = "\n".join(lines) + "\n"
        if expired.is_set():
            return code, output, f"timed out after {timeout:g}s (job {started.job.id} killed)"
        if code is None:
            return None, output, f"job {started.job.id} ended without an exit code"
        return code, output, None

    return start


def link_line(cluster: ClusterRecord, rows: Sequence[Row]) -> str | None:
    """`bench allreduce`'s busbw / B line, where the cluster's links are shaped to a rate B."""
    rate = get_provider(cluster.provider).link_rate(cluster)
    return link_ratios(rows, rate) if rows and rate else None
