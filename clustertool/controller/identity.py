"""The rights of the machine that runs the controller, through the provider's hooks (providers/base.py).

On the local provider the controller runs on this machine with its own rights: nothing to make.  On AWS
(providers/aws/controller_iam.py) the controller's node gets an instance profile whose policy allows what
`replace` calls, only on this cluster's tagged resources; `down` takes it back (before the instances go),
and `down --sweep` finds a lost state's by its tags.  The caller holds the cluster's lock
(``session.locked``): these record what they make in the cluster's state and save it at each step.
"""

from __future__ import annotations

from clustertool.cluster.session import ClusterSession


def give(session: ClusterSession, node: str | None, keep_old: bool = False) -> list[str]:
    """Rights for the controller on ``node`` (None: on this machine); lines saying what was made."""
    return session.provider.controller_identity(session.record, node, keep_old=keep_old, save=session.save)


def take_back(session: ClusterSession) -> list[str]:
    """Remove what :func:`give` made (idempotent); lines saying what went."""
    return session.provider.remove_controller_identity(session.record, save=session.save)
