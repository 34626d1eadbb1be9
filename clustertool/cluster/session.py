"""One command's cluster: the session object every command makes once and hands to the core.

A ``ClusterSession`` holds the cluster's record, its provider (made when first asked for), the
transport that reaches its nodes and the reporter for progress lines.  Core functions take it
instead of a cluster name to reload and a transport to pass along.  The Python API's
``Cluster`` is one (api.py adds the verbs); a test hands it a scripted transport.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from clustertool.core import state
from clustertool.core.model import ClusterRecord, Node, Reporter, silent
from clustertool.providers.base import Provider, get_provider
from clustertool.remote.transport import SSH, Link, Transport


class ClusterSession(Link):
    """The cluster record, its provider, the transport and the reporter, for one command."""

    def __init__(self, record: ClusterRecord, transport: Transport = SSH, report: Reporter = silent,
                 provider: Provider | None = None) -> None:
        super().__init__(record, transport)
        self.report = report
        self._provider = provider  # made when first asked for, unless given

    @classmethod
    def load(cls, name: str | None = None, *, transport: Transport = SSH,
             report: Reporter = silent) -> "ClusterSession":
        """The cluster named (default: the only one this machine knows), from its state file."""
        return cls(state.load(state.resolve_name(name)), transport, report)

    def fresh(self) -> "ClusterSession":
        """Another session of the same cluster, transport and reporter, its record read again (for a
        thread of its own: a session's record is not shared between threads)."""
        return type(self)(state.load(self.name), self.transport, self.report)

    @property
    def provider(self) -> Provider:
        if self._provider is None:
            self._provider = get_provider(self.record.provider, report=self.report)
        return self._provider

    @property
    def nodes(self) -> list[Node]:
        """Leader first, then members, then servers (the record's own order for hostfiles)."""
        return self.record.ordered_nodes()

    def save(self) -> None:
        state.save(self.record)

    @contextmanager
    def locked(self, purpose: str = "") -> Iterator[ClusterRecord]:
        """Hold the cluster's lock and read its record afresh under it."""
        with state.locked(self.name, purpose=purpose):
            yield self.reload()
