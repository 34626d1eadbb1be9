"""`down --sweep`: what a provider's clusters left that no state of this home knows (a killed `up`,
a deleted state file), found and removed through the provider's hooks (providers/base.py:
``sweep``, ``remove_swept``). The removed clusters of this home lose their files here too (key,
lock, hostfile); before a provider asks which clusters this home knows, the ones their watcher
powered off are noticed (as `ls` does)."""

from __future__ import annotations

from clustertool.cluster import autostop, controllerproc, lifecycle
from clustertool.cluster.status import list_all
from clustertool.core.model import Reporter, silent
from clustertool.providers.base import Sweep, SweepRequest, get_provider


def find(provider: str, *, region: str | None = None, profile: str | None = None, force_owner: bool = False,
         any_home: bool = False, report: Reporter = silent) -> Sweep:
    """The orphans of ``provider``'s clusters, each marked delete or keep, as the table to show."""
    def known() -> tuple[set[str], set[str]]:
        for line in autostop.refresh([c for c in list_all() if c.provider == provider]):
            report(line)
        return lifecycle.known()

    request = SweepRequest(known, region, profile, force_owner, any_home, report)
    return get_provider(provider, report=report).sweep(request)


def remove(swept: Sweep, report: Reporter = silent) -> tuple[list[str], list[str]]:
    """Delete what ``swept`` marked; (what was removed, the lines about this machine's files)."""
    strays = controllerproc.stop_strays()  # first: a controller whose state is gone must not see the nodes go
    done = get_provider(swept.provider, report=report).remove_swept(swept, report)
    return done.removed, strays + [line for name, cluster_id in done.forget
                                   for line in lifecycle.forget_leftovers(name, cluster_id or "")]
