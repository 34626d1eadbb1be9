"""The provider protocol: a handful of verbs, dataclasses in and out, an explicit registry.

A provider makes machines exist and go away; everything after "a node answers SSH"
(keys, known_hosts, hostfiles, exec) is provider-independent and lives elsewhere.

Lifecycle, as driven by ``clustertool.lifecycle``::

    check(request)            fail fast on missing prerequisites / bad options
    plan(request)             lines describing what would be made (--dry-run)
    run_instances(request)    make the machines; record every created resource in
                              request.cluster.provider_state and call request.save()
                              right after each, so an interrupted `up` can be undone
    wait_instances(cluster)   until every node answers on its SSH port (only until "running"
                              when cluster.options.get("no_ssh")); fills ssh_host, and
                              host_keys when the provider knows them
    owns_cluster(cluster)     optional: False when down must not terminate (adopted machines);
                              defaults to the class attribute owns_machines
    describe(cluster)         optional: dict of extra status lines (hourly cost, cost so far)
    query_instances(cluster)  current node states (status)
    stop_instances / start_instances   keep disks; start returns refreshed nodes
    terminate_instances(cluster)       remove everything the provider made; idempotent,
                                       safe on half-created clusters; returns lines saying
                                       what was removed
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

from clustertool.errors import UsageError
from clustertool.model import Cluster, Node, Reporter, silent


@dataclass(frozen=True)
class OptionSpec:
    """One provider option, usable as a YAML spec key and (with '-' for '_') a flag."""

    type: type = str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None


@dataclass
class ProvisionRequest:
    cluster: Cluster  # name, user, options already validated
    count: int
    slots: int | None  # explicit --slots override, else provider decides (GPU count)
    public_key: str  # the cluster's public key line
    key_path: Path  # the cluster's private key (0600)
    files_dir: Path  # the cluster's own directory for provider files
    save: Callable[[], None] = lambda: None  # persist cluster state now
    report: Reporter = silent  # progress lines for the user
    dry_run: bool = False


class Provider(Protocol):
    name: ClassVar[str]
    OPTIONS: ClassVar[dict[str, OptionSpec]]
    default_user: ClassVar[str]
    owns_machines: ClassVar[bool]  # False for adopted machines: down never terminates them
    # optional key_type: ClassVar[tuple[str, ...]], ssh-keygen's -t/-b for the cluster key when the
    # default (transport.KEYGEN_TYPE, P-256) will not do

    def check(self, request: ProvisionRequest) -> None: ...

    def plan(self, request: ProvisionRequest) -> list[str]: ...

    def run_instances(self, request: ProvisionRequest) -> list[Node]: ...

    def wait_instances(self, cluster: Cluster, timeout: float = 600.0) -> list[Node]: ...

    def query_instances(self, cluster: Cluster) -> list[Node]: ...

    def stop_instances(self, cluster: Cluster) -> None: ...

    def start_instances(self, cluster: Cluster) -> list[Node]: ...

    def terminate_instances(self, cluster: Cluster) -> list[str]: ...


REGISTRY: dict[str, str] = {
    "local": "clustertool.providers.local:LocalProvider",
    "static": "clustertool.providers.static:StaticProvider",
    "aws": "clustertool.providers.aws:AwsProvider",
}


def provider_class(name: str) -> type[Provider]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UsageError(
            f"unknown provider {name!r}", hint=f"choose one of: {', '.join(sorted(REGISTRY))}"
        ) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_provider(name: str, **kwargs: Any) -> Provider:
    return provider_class(name)(**kwargs)

