"""`clustertool bench allreduce`: collnet_bench on every worker (one rank per node), as a `run` job.

The plugin must be deployed (`plugin deploy`); with ``servers`` among the algorithms the job is run as
`run --plugin`, which starts its reducers on the cluster's reduction servers.  The rows are
all_reduce_perf's; where the cluster's links are shaped to a rate (the provider's ``link_rate`` hook) one
line says how close each algorithm came to it; with ``tuner_csv`` a tuner table is written from the rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clustertool.bench.allreduce import Row, bench_argv, check_servers, parse_rows, tuner_table
from clustertool.bench.benchjobs import OnLine, launcher, link_line
from clustertool.bench.benchrequests import AllreduceBenchRequest
from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import ToolError, UsageError
from clustertool.plugin.build import BENCH, load_record


@dataclass
class AllreduceResult:
    """What `bench allreduce` measured (``to_dict()`` is its --json)."""

    cluster: str
    ranks: int  # one per worker node that is not cordoned
    servers: int | None  # the reduction servers the job used (None: servers not among the algorithms)
    code: int | None  # mpirun's exit code (None: it did not start, or ended without one)
    error: str | None
    rows: list[Row] = field(default_factory=list)
    link_line: str | None = None  # busbw / link rate per algorithm, where the cluster declares a link rate
    tuner_csv: str | None = None  # where the tuner table was written

    @property
    def failure(self) -> str | None:
        """Why the run failed (it did not run, mpirun failed, no row came), or None."""
        if not self.error and self.code == 0 and self.rows:
            return None
        why = (self.error or f"mpirun exit {self.code}") if self.code else "no result rows"
        return f"allreduce benchmark failed: {why}"

    @property
    def wrong(self) -> bool:
        """A row whose result differs from MPI_Allreduce of the same inputs."""
        return any(r.wrong > 0 for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.wrong

    def to_dict(self) -> dict[str, Any]:
        return {"exit_code": self.code, "error": self.error, "rows": [asdict(r) for r in self.rows]}


def run_allreduce(session: ClusterSession, request: AllreduceBenchRequest, *,
                  on_line: OnLine | None = None) -> AllreduceResult:
    """Run the benchmark; ``on_line(node, "stdout", line)`` sees collnet_bench's output as it comes.  A run
    that failed is a value (``failure``); a cluster that cannot run it (no deploy, no servers) raises."""
    cluster = session.record
    deployed = load_record(cluster.name).get("deployed")
    if not deployed:
        raise ToolError(f"the plugin is not deployed on {cluster.name!r}", hint="clustertool plugin build && "
                                                                                "clustertool plugin deploy")
    servers = "servers" in request.algos
    check_servers(request.algos, cluster.name, len(cluster.servers))
    if servers and cluster.servers and not cluster.schedulable_servers:  # cordoned servers get no reducer
        names = ",".join(n.name for n in cluster.servers)
        raise UsageError(f"--algo servers: every reduction server of {cluster.name!r} is cordoned",
                         hint=f"`clustertool uncordon {names}`, or leave servers out of --algo")
    argv = bench_argv(f"{deployed['dest'].rstrip('/')}/{BENCH}", request.size_range(), request.algos,
                      dtype=request.dtype, op=request.op, iters=request.iters, warmup=request.warmup,
                      request=request.request_bytes, depth=request.depth, one_request=request.one_request)
    extra = [f"CLUSTERTOOL_SOCKET_IFNAME={request.ifname}"] if request.ifname else []
    # servers: run as `run --plugin`, which starts this job's reducers on the server nodes
    launch = launcher(session, env=extra + list(request.env), timeout=request.timeout, on_line=on_line,
                      plugin=servers)
    code, output, error = launch(cluster.schedulable, 1, argv)  # every worker not cordoned
    out = AllreduceResult(cluster.name, len(cluster.schedulable), len(cluster.schedulable_servers) if servers else None,
                          code, error, parse_rows(output))
    out.link_line = link_line(cluster, out.rows)
    if request.tuner_csv is not None and out.rows:
        path = Path(request.tuner_csv)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tuner_table(out.rows, len(cluster.schedulable)))
        out.tuner_csv = str(path)
    return out
