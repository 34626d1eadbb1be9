"""What a cluster record says about its Slurm (``ClusterRecord.scheduler``), as one typed value.

Two kinds of Slurm cluster: one ``up --scheduler slurm`` made (clustertool wrote its config and runs
its daemons: ``made``), and one adopted with ``up --provider static --slurm-login HOST`` (the site's
Slurm: clustertool reads it, never changes its config or daemons).  Either way a node of the record
has a Slurm name: the same as its own on a cluster clustertool made, the one ``sinfo`` lists on an
adopted one (``names``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from clustertool.core import nodeset
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.slurm.layout import Layout, system_layout

SCHEDULERS = ("none", "slurm")
KIND = "slurm"


@dataclass(frozen=True)
class SlurmInfo:
    layout: Layout
    controller: str                 # the node (clustertool's name) where slurmctld runs, or the login node
    nodes: tuple[str, ...]          # the compute nodes, clustertool's names, in hostlist order
    partition: str | None = None    # None: the site's default partition (adopted)
    release: str = ""               # e.g. 22.05.8
    made: bool = True               # False: adopted (never change its config or daemons)
    leader_compute: bool = True
    standin_gpus: int = 0           # stand-in GPUs made on each local node (0: none or real ones)
    gpus: int = 0                   # GPUs (GRES gpu) of each compute node
    names: dict[str, str] = field(default_factory=dict)  # clustertool name -> Slurm name, where they differ
    operator: bool | None = None    # adopted: whether the user may drain nodes (None: not known yet)
    ready: bool = True              # False: the daemons were never set up (up --no-ssh)

    def slurm_name(self, node: str) -> str:
        return self.names.get(node, node)

    def node_of(self, slurm_name: str) -> str | None:
        """Our name of a Slurm node (None: not a node of this record)."""
        for ours in self.nodes:
            if self.slurm_name(ours) == slurm_name:
                return ours
        return None

    def slurm_names(self, nodes: list[str] | tuple[str, ...]) -> list[str]:
        return [self.slurm_name(n) for n in nodes]

    def hostlist(self, nodes: list[str] | tuple[str, ...] | None = None) -> str:
        return nodeset.fold(self.slurm_names(list(self.nodes if nodes is None else nodes)))

    def compute(self, record: ClusterRecord) -> list[Node]:
        """The record's nodes Slurm runs jobs on, in the record's order."""
        wanted = set(self.nodes)
        return [n for n in record.ordered_nodes() if n.name in wanted]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["kind"] = KIND
        out["nodes"] = list(self.nodes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SlurmInfo":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["layout"] = Layout(**data["layout"]) if data.get("layout") else system_layout()
        values["nodes"] = tuple(values.get("nodes") or ())
        values["names"] = dict(values.get("names") or {})
        return cls(**values)


def of(record: ClusterRecord) -> SlurmInfo | None:
    """The cluster's Slurm (None: clustertool starts its jobs itself)."""
    data = record.scheduler
    if not data or data.get("kind") != KIND or not data.get("layout"):
        return None
    return SlurmInfo.from_dict(data)


def wanted(record: ClusterRecord) -> bool:
    """Whether the record asks for Slurm (made or adopted), set up or not yet."""
    return bool(record.scheduler and record.scheduler.get("kind") == KIND)


def require(record: ClusterRecord, what: str) -> SlurmInfo:
    info = of(record)
    if info is None or not info.ready:
        why = "was brought up with --no-ssh: its Slurm was never set up" if wanted(record) else "has no Slurm"
        raise UsageError(f"{what}: cluster {record.name!r} {why}",
                         hint="`clustertool up --scheduler slurm` makes one; `--provider static --slurm-login HOST` "
                              "adopts yours")
    return info


def check_scheduler(value: str) -> str:
    if value not in SCHEDULERS:
        raise UsageError(f"--scheduler {value!r}: use {' or '.join(SCHEDULERS)}")
    return value
