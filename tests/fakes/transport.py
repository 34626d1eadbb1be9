"""The test transports ship with the package (clustertool/remote/testing.py), as Fabric ships
fabric/testing: the suite imports them from here, users from there."""

from clustertool.remote.testing import Call, LocalShell, Reply, ScriptedTransport

__all__ = ["Call", "LocalShell", "Reply", "ScriptedTransport"]
