"""What a user asks of the cluster commands (up, down, replace), one typed value each:
built alike by the CLI and the API, checked once when made (a bad value is one UsageError naming the
flag, with a hint), handed whole to the core."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clustertool.cluster.spec import ClusterSpec
from clustertool.core.errors import UsageError


@dataclass(frozen=True)
class UpRequest:
    """One `clustertool up`: the spec (a file and/or flags, checked by cluster/spec.py's load_spec)."""

    spec: ClusterSpec
    dry_run: bool = False  # print the plan, make nothing
    no_ssh: bool = False  # stop after provisioning and the hostfile
    controller: bool = False  # start the recovery controller (cluster/controllerup.py) once the cluster is up
    controller_node: str | None = None  # where it runs (AWS: its instance profile there); implies controller

    def __post_init__(self) -> None:
        if self.controller_node is not None and not self.controller_node.strip():
            raise UsageError("--controller-node: an empty node name", hint="e.g. --controller-node node-2")

    @property
    def wants_controller(self) -> bool:
        return self.controller or self.controller_node is not None


@dataclass(frozen=True)
class DownRequest:
    """One `clustertool down` of a cluster this home knows."""

    terminate_adopted: bool = False  # also terminate machines the cluster adopted
    force_owner: bool = False  # act on a cluster whose tags say another owner
    keep_shared_fs: bool = False  # keep the filesystems `up` made, with their data


@dataclass(frozen=True)
class ReplaceRequest:
    """One `clustertool replace NODE...`: new machines for ``nodes`` (a selection: node-3, node-[3-4],
    comma lists); ``copy``: paths then copied from the leader to the same path on the new nodes;
    ``keep_old`` (AWS): the old instance stopped and kept, not terminated."""

    nodes: str
    copy: tuple[str, ...] = ()
    keep_old: bool = False

    def __post_init__(self) -> None:
        if not self.nodes.strip():
            raise UsageError("no node given", hint="e.g. clustertool replace node-3 --yes")
        if any(not p.strip() for p in self.copy):
            raise UsageError("--copy: an empty path", hint="e.g. --copy data/train (a path on the leader)")


def selection(nodes: str | Sequence[str]) -> str:
    """A node selection from one string or a list of names / patterns (the CLI's NODE... arguments)."""
    return nodes if isinstance(nodes, str) else ",".join(str(n) for n in nodes)
