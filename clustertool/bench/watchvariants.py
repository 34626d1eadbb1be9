"""`bench compare --watch`: the cost of watching a job, as variants of the same job.

``off``: no monitoring and no job recorder (`run --no-record`); ``record``: the recorder every job starts by
default (the watch hub sampling the job's nodes every 5 s); ``monitoring``: `monitoring enable` (node exporters,
clustertool's exporter and Prometheus) as well.  Before each run the cluster's monitoring is switched to what the
variant wants; at the end it is put back as it was.
"""

from __future__ import annotations

import time

from clustertool.cluster import monitoring
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError, UsageError
from clustertool.core.model import Reporter, silent

WATCH_VARIANTS = ("off", "record", "monitoring")
SETTLE_S = 20.0  # after a switch: Prometheus's start (its data read back) is not what a job pays once it runs


def check(names: list[str]) -> None:
    bad = [n for n in names if n not in WATCH_VARIANTS]
    if bad:
        raise UsageError(f"--watch: variant(s) {', '.join(bad)}: expected {', '.join(WATCH_VARIANTS)}",
                         hint="e.g. clustertool bench compare --watch --variants off,record,monitoring -- CMD")


class WatchSwitch:
    """Called with each variant's name before its run; ``record`` then says whether the job records itself."""

    def __init__(self, session: ClusterSession, report: Reporter = silent, settle_s: float = SETTLE_S) -> None:
        self.session, self.report, self.record, self.settle_s = session, report, True, settle_s
        self.initial = monitoring.setting(session.reload())

    def __call__(self, name: str) -> None:
        on = monitoring.setting(self.session.reload()) is not None
        switched = (name == "monitoring") != on
        if switched and not on:
            self._check(monitoring.enable(self.session, self.initial or monitoring.MonitoringRequest()))
        elif switched:
            self._check(monitoring.disable(self.session))
        if switched and self.settle_s:
            self.report(f"monitoring {'off' if on else 'on'}; {self.settle_s:g} s for it to settle")
            time.sleep(self.settle_s)
        self.record = name != "off"

    def _check(self, result: monitoring.MonitoringResult) -> None:
        if result.problems:
            raise ToolError(f"monitoring {result.verb}: {'; '.join(result.problems)}")

    def restore(self) -> None:
        """Monitoring as it was before the benchmark."""
        on = monitoring.setting(self.session.reload()) is not None
        if self.initial is not None and not on:
            monitoring.enable(self.session, self.initial)
        elif self.initial is None and on:
            monitoring.disable(self.session)
