"""The recovery controller: what replaces a lost node while nobody watches (issue 35).

The leader's restart loop (nodeprogs/restarts.py) stops a job whose node was lost and waits for someone
with the rights to replace the node.  The controller is that someone, running where the user's laptop is
not needed: a detached process on this machine (process.py; local provider and AWS).  On AWS the controller's
node (`up --controller-node`) gets an instance profile scoped to the cluster (providers/aws/controller_iam.py,
through the provider hooks in identity.py); the service that would run this program there is not built yet.

loop.py       the rounds: the leader's waits (nodeprogs/waiting.py) replaced (jobs/replacing.py), a lost leader
              replaced and its jobs planned again (jobs/recovery.py, jobs/replan.py)
process.py    serve: the detached process's body (start / stop / running: cluster/controllerproc.py, re-exported)
daemon.py     its command line (``python -m clustertool.controller.daemon run NAME``)
identity.py   the rights of the machine that runs it (the provider's hooks)
"""
