"""The recovery controller: what replaces a lost node while nobody watches (issue 35).

The leader's restart loop (nodeprogs/restarts.py) stops a job whose node was lost and waits for someone
with the rights to replace the node.  The controller is that someone, running where the user's laptop is
not needed: on the local provider a detached process on this machine (process.py), on AWS the same program
on the controller's node, whose only rights come from an instance profile scoped to the cluster
(providers/aws/controller_iam.py, reached through the provider hooks in identity.py).

loop.py       the rounds: the leader's waits (nodeprogs/waiting.py), handed to a handler once each
process.py    start / stop / running: one detached process per cluster, under a lock in the cluster's folder
daemon.py     its command line (``python -m clustertool.controller.daemon run NAME``)
identity.py   the rights of the machine that runs it (the provider's hooks)
"""
