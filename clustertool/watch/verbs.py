"""The watch verbs of the Python API (``Cluster.top``, ``watch``, ``monitoring``, ``metrics_query``,
``stragglers``; ``Job.report``, ``Job.stragglers``): the functions `top`, `monitoring`, `metrics`, `report` and
`stragglers` call, returning their data.  api.py's ``Cluster`` and ``Job`` take them in as mixins."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

from clustertool.cluster import monitoring
from clustertool.cluster.monitoring import MonitoringRequest, MonitoringResult
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.watchplan import WatchRequest
from clustertool.core.errors import UsageError
from clustertool.core.model import JobRecord
from clustertool.watch import hub, metrics, report, stragglers
from clustertool.watch.report import ReportFiles
from clustertool.watch.stragglers import StragglerReport


def _refs(jobs: str | Sequence[str]) -> tuple[str, ...]:
    return (jobs,) if isinstance(jobs, str) else tuple(str(j) for j in jobs)


class ClusterWatch(ClusterSession):
    """`top`, `monitoring`, `metrics query` and `stragglers` of a cluster, as data."""

    def top(self, jobs: str | Sequence[str] = (), *, metric_regex: Sequence[str] = (), interval: float = 0.3,
            samples: int = 3) -> dict[str, Any]:
        """One reading of every node and every running job's ranks (``jobs``: only these ids or names), after
        ``samples`` readings ``interval`` s apart: the dict `top --once --json` prints (``nodes``: per node GPU,
        CPU, memory, network, disk, cordon, state; ``jobs``: per job its ``ranks`` with step, rate, step time,
        ``outlier``, and ``stragglers`` where the reducers record them; ``outliers``)."""
        request = WatchRequest(jobs=_refs(jobs), regex=tuple(metric_regex), interval=interval, samples=samples)
        return hub.snapshot(self, request)

    def watch(self, jobs: str | Sequence[str] = (), *, metric_regex: Sequence[str] = (),
              interval: float = 1.0) -> Iterator[dict[str, Any]]:
        """`top`'s live stream: one view (as ``top()``'s) every ``interval`` s for as long as the loop asks; closing
        the iterator (leaving the loop) stops the watch on the leader and every node."""
        request = WatchRequest(jobs=_refs(jobs), regex=tuple(metric_regex), interval=interval)
        with hub.stream(self, request) as live:
            yield from live.views()

    def monitoring(self, enable: bool | None = True, **settings: Any) -> MonitoringResult:
        """`monitoring enable` (``enable=True``; keywords: ``scrape_interval="15s"``, ``retention_time="15d"``,
        ``retention_size="2GB"``), `monitoring disable` (``False``) or `monitoring status` (``None``): each node's
        processes (``.nodes``), ``.problems``, ``.prometheus``; ``to_dict()`` is the --json."""
        if enable is None or enable is False:
            if settings:
                raise UsageError("monitoring settings go with enable=True")
            return monitoring.status(self) if enable is None else monitoring.disable(self)
        return monitoring.enable(self, MonitoringRequest(**settings))

    def metrics_query(self, expr: str) -> dict[str, Any]:
        """`metrics query EXPR`: Prometheus's instant-query ``data`` ({"resultType", "result"}), asked on the leader."""
        return metrics.query(self, expr)

    def stragglers(self, job: str | None = None) -> StragglerReport:
        """`stragglers JOB` (None: the one running job): the workers that made the others wait, from the reducers'
        lateness records (or the plugin's per-rank wait without servers); ``.workers``, ``.note``."""
        return stragglers.fetch(self, job)


class JobWatch:
    """`report JOB` and `stragglers JOB` of one job (api.Job)."""

    cluster: ClusterWatch
    record: JobRecord

    def report(self, prefix: str | Path | None = None) -> ReportFiles:
        """`report JOB -o PREFIX`: ``PREFIX.html`` (self-contained) and ``PREFIX.png`` (matplotlib, the train extra;
        ``png_skipped`` says why not) from the job's watch record on the leader (default prefix:
        ``./<job>-report``)."""
        run = report.fetch(self.cluster, self.record.id)
        return report.write(run, prefix if prefix is not None else Path(f"{run.job}-report"))

    def stragglers(self) -> StragglerReport:
        """The job's stragglers (``Cluster.stragglers``)."""
        return self.cluster.stragglers(self.record.id)
