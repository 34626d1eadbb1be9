"""The ``local`` provider: N real nodes on this machine, each in its own namespaces, running sshd.

``local_provider`` holds ``LocalProvider`` (the hooks of providers/base.py); ``nodes``, ``net``,
``sysops``, ``firewall``, ``swap``, ``removal``, ``strays`` and ``localfs`` what it runs.
"""
