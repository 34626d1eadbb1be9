"""A lost leader survived: the job planned again from its kept request (issue 35, section 6).

`run` keeps the job's :class:`RunRequest` as JSON beside its record (``jobs/<id>.request.json``, 0600) when
it was run with --replace-failed (jobs/recoveryprep.py).  After the leader was replaced (jobs/recovery.py:
`recover`, or the cluster's controller), :func:`relaunch` plans the job again with the same id on the cluster
as it is now: the hostfile and mpirun's ``-H`` name the new addresses, MASTER_ADDR and the rendezvous the new leader, a
node launcher's agent (agent.json, jobagent.py) is put on every node (the new leader's disk is empty), and
the start carries the attempts so far (``prefix``), so the restart loop goes on with the next restart count.
The ssh configuration follows the new leader already: `replace` wires every node again.

Not carried over: the plugin's reduction servers (a job run with --plugin is not planned again here), and
what was on the old leader's disk (a --sync folder is sent again from this machine; checkpoints are gone
unless they were on shared storage).
"""

from __future__ import annotations

from clustertool.cluster.session import ClusterSession
from clustertool.core.model import JobRecord
from clustertool.jobs import launch, syncdir
from clustertool.jobs.jobrequests import RunRequest


def relaunch(session: ClusterSession, job: JobRecord, request: RunRequest, prefix: str) -> str | None:
    """Plan ``job`` again on the cluster as it is now and start it on the (new) leader, ``prefix`` (the attempts
    so far) written first; None, or why it could not."""
    if request.plugin:
        return f"job {job.id} ran with --plugin: its reduction servers are not started again after a lost leader"
    cluster = session.record
    known = {n.name for n in cluster.nodes}
    nodes = [cluster.node(n) for n in job.nodes if n in known]
    if len(nodes) != len(job.nodes):
        return f"job {job.id}: some of its nodes ({', '.join(job.nodes)}) are no longer in the cluster"
    synced_dir = request.sync.target() if request.sync is not None else None
    environment = session.provider.rank_environment(cluster)
    plan = launch.plan_job(cluster, nodes, request.mpi_options(), job.id, sync=synced_dir, plugin_env={},
                           servers=[], node_env=environment.env)
    home, port = launch.preflight(session, list(plan.nodes), True, program=plan.program, path=plan.rank_path)
    if synced_dir is not None:  # the new leader's disk lacks the folder the job runs in
        syncdir.sync(session, *synced_dir, [cluster.leader])
    plan = plan.with_facts(home, None, port or launch._fallback_port(plan.job_id))
    if plan.spec.node_launcher:
        launch._install_agent(session, plan)
    record = launch.job_record(cluster, plan, request, job.on_preempt_signal)
    record.started, record.name = job.started, job.name
    launch._start(session, plan, record, [], None, request.record, prefix=prefix)
    return None
