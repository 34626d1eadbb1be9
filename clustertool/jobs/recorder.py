"""The job's own watch recorder: the watch hub in ``record`` mode, started on the leader with every job.

It samples the job's nodes (and its reduction servers) every RECORD_INTERVAL_S seconds, over the cluster's own
ssh from the leader, and writes ``~/.clustertool/jobs/<id>/watch/samples.jsonl`` there, so `report JOB` (and the
end-of-job report of `run --follow`) works for any job, not only while `monitoring` runs.  It ends by itself
once the job has ended (launch.sh wrote ``exit``, or launch.sh is gone); while `monitoring`'s exporter records the
same job, whoever took the record's lock first keeps writing it.  It does not carry the job's mark
(CLUSTERTOOL_JOB), so the next job's preflight never waits for it; `kill` still stops it with launch.sh's session.
"""

from __future__ import annotations

from clustertool import nodeprogs
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.watchplan import WatchRequest, hub_args
from clustertool.jobs.jobplan import JobPlan

RECORD_INTERVAL_S = 5.0  # ~1 KB a reading at 32 nodes: ~0.7 MB an hour (thinned past 32 MB)


def recorder_program(session: ClusterSession, plan: JobPlan) -> bytes:
    """The leader's recorder for ``plan``'s job (written to the job's folder as watchrec.py)."""
    args = hub_args(session, "record", WatchRequest(interval=RECORD_INTERVAL_S), [plan.job_id],
                    nodes=[*plan.nodes, *plan.servers])
    args["job"] = plan.job_id
    return nodeprogs.program_text("watchhub", args)
