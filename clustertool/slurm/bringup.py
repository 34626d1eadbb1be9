"""Slurm on a cluster's nodes: probe them, write the config, start munged, slurmctld and slurmd, wait.

``setup`` is the whole bring-up on a cluster that is up and reachable (its session, or any Link):

1. each node is probed (``slurmd -C``, ``slurmd -V``, its GPU devices; stand-in GPUs made first on
   local nodes when asked); every node must run the same Slurm release;
2. slurm.conf, gres.conf and cgroup.conf are written from the record and those sizes (slurmconf);
3. the leader gets the files, the munge key (on stdin, 0400) and its start script, and starts
   munged, slurmctld (and slurmd when it computes); then every other node the same, with munged
   and slurmd;
4. ready when every compute node is idle in ``sinfo`` and ``srun -N<all> true`` works.

Nothing here prints: progress goes to ``report``; a node's failure is a SlurmError naming it.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from typing import Sequence

from clustertool.core import nodeset
from clustertool.core.model import HostResult, Node, Reporter, silent
from clustertool.remote.group import run_on_node, run_on_nodes
from clustertool.remote.transport import Link
from clustertool.slurm import SlurmError, nodescript, slurmcmd, slurmtext
from clustertool.slurm.layout import Layout, private_layout
from clustertool.slurm.slurmconf import NodeSize, SlurmSettings, Timers, compute_nodes, conf_files, settings_for

POLL = 0.25  # seconds between two looks at sinfo while nodes register


@dataclass(frozen=True)
class Probe:
    node: str
    size: NodeSize
    version: tuple[int, int, int]
    gpus: int


def parse_probe(node: str, text: str) -> Probe:
    lines = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if not {"size", "version", "gpus"} <= lines.keys():
        raise SlurmError(f"{node}: the Slurm probe said {text.strip()[-200:]!r}")
    return Probe(node, slurmtext.node_size(lines["size"]), slurmtext.version(lines["version"]), int(lines["gpus"]))


def _failure(what: str, result: HostResult) -> SlurmError:
    text = (result.stdout + result.stderr).strip().splitlines()
    said = next((ln for ln in reversed(text) if ln.startswith("error:")), None)
    return SlurmError(f"{what} on {result.node}: {said[len('error: '):] if said else result.reason}")


def probe(link: Link, nodes: Sequence[Node], layout: Layout, standin_gpus: int = 0,
          timeout: float = 60) -> dict[str, Probe]:
    """Each node's size, Slurm release and GPU count (``standin_gpus``: make that many stand-ins first)."""
    script = nodescript.probe_script(layout, standin_gpus).encode()
    result = run_on_nodes(link, nodes, root_shell(link), timeout=timeout, stdin_data=script)
    for failed in result.failed():
        raise _failure("the Slurm probe failed", failed)
    probes = {r.node: parse_probe(r.node, r.stdout) for r in result.results}
    releases = {p.version for p in probes.values()}
    if len(releases) > 1:
        where = {v: nodeset.fold([p.node for p in probes.values() if p.version == v]) for v in releases}
        seen = ", ".join(f"{slurmtext.release_text(v)} on {where[v]}" for v in sorted(releases))
        raise SlurmError(f"the nodes run different Slurm releases ({seen})",
                         hint="every node of a Slurm cluster must run the same release")
    return probes


def root_shell(link: Link) -> str:
    """The remote shell that runs a node program as root: ``sh -s``, with ``sudo -n`` for another user."""
    return "sh -s" if link.record.user == "root" else "sudo -n sh -s"


def install(link: Link, settings: SlurmSettings, key: bytes, *, standin_gpus: int = 0, timeout: float = 60,
            report: Reporter = silent, only: Sequence[str] | None = None, boot_hook: str | None = None,
            start: bool = True) -> None:
    """Files, key and start scripts on every node (``only``: these); the leader's daemons first, then the
    others'.  ``boot_hook``: where a local node's boot finds its start script; ``start``: False writes the
    files only (a new slurm.conf before ``scontrol reconfigure``)."""
    files = conf_files(settings)
    record = link.record
    compute = set(settings.node_names)
    nodes = [n for n in record.ordered_nodes() if n.name in compute or n.name == settings.controller]
    if only is not None:
        nodes = [n for n in nodes if n.name in set(only)]

    def script(node: Node) -> bytes:
        start_text = nodescript.start_script_text(settings.layout, node.name,
                                                  controller=node.name == settings.controller,
                                                  compute=node.name in compute, standin=standin_gpus > 0,
                                                  slurm_user=settings.slurm_user)
        return nodescript.install_script(settings.layout, files, key, start_text, start=start,
                                         standin_gpus=standin_gpus if node.name in compute else 0,
                                         boot_hook=boot_hook).encode()

    leader = [n for n in nodes if n.name == settings.controller]
    for group, what in ((leader, "slurmctld"), ([n for n in nodes if n not in leader], "slurmd")):
        if not group:
            continue
        result = run_on_nodes(link, group, root_shell(link), timeout=timeout, stdin_data=script)
        for failed in result.failed():
            raise _failure("Slurm did not start" if start else "Slurm's files were not written", failed)
        if start:
            report(f"slurm: {what} started on {nodeset.fold([n.name for n in group])}")


def slurm_command(layout: Layout, argv: Sequence[str]) -> str:
    """The remote shell line running a Slurm client against the cluster's config."""
    return shlex.join(slurmcmd.with_conf(layout, argv))


def run_slurm(link: Link, node: Node, layout: Layout, argv: Sequence[str], timeout: float = 60) -> HostResult:
    return run_on_node(link, node, slurm_command(layout, argv), timeout=timeout)


def node_states(link: Link, layout: Layout, timeout: float = 30) -> list[slurmtext.SinfoNode]:
    result = run_slurm(link, link.record.leader, layout, slurmcmd.sinfo_nodes_argv(), timeout=timeout)
    if not result.ok:
        raise SlurmError(f"sinfo failed on {result.node}: {result.reason}")
    return slurmtext.sinfo_nodes(result.stdout)


def wait_idle(link: Link, settings: SlurmSettings, timeout: float = 60) -> list[slurmtext.SinfoNode]:
    """Until every compute node is idle in sinfo (registered, responding, not drained)."""
    return wait_names_idle(link, settings.layout, settings.node_names, settings.controller, timeout)


def wait_names_idle(link: Link, layout: Layout, names: Sequence[str], controller: str,
                    timeout: float = 60) -> list[slurmtext.SinfoNode]:
    """Until each Slurm node of ``names`` is idle in sinfo (asked on the leader)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            nodes = node_states(link, layout)
        except SlurmError:
            nodes = []  # slurmctld may not answer for its first moments
        by_name = {n.name: n for n in nodes}
        waiting = [name for name in names if not (name in by_name and by_name[name].idle)]
        if not waiting:
            return nodes
        if time.monotonic() > deadline:
            raise _not_idle(layout, controller, waiting, by_name)
        time.sleep(POLL)


def _not_idle(layout: Layout, controller: str, waiting: list[str],
              by_name: dict[str, slurmtext.SinfoNode]) -> SlurmError:
    first = waiting[0]
    seen = by_name.get(first)
    what = f"{seen.state}{seen.flags} ({seen.reason})" if seen else "not listed by sinfo (slurmctld did not answer)"
    return SlurmError(f"{nodeset.fold(waiting)} not idle in Slurm: {first} is {what}",
                      hint=f"see {layout.log_file('slurmd')} on {first} and "
                           f"{layout.log_file('slurmctld')} on {controller}")


def check_srun(link: Link, settings: SlurmSettings, timeout: float = 60) -> None:
    """``srun -N<all> true`` from the leader: every node runs a step."""
    argv = slurmcmd.srun_argv(slurmcmd.StepSpec(command=["true"], nodes=len(settings.nodes)))
    result = run_slurm(link, link.record.leader, settings.layout, argv, timeout=timeout)
    if not result.ok:
        raise SlurmError(f"srun -N{len(settings.nodes)} true failed on the leader: {result.reason}")


def setup(link: Link, key: bytes, *, layout: Layout | None = None, leader_compute: bool = True,
          standin_gpus: int = 0, cgroups: bool = False, slurm_user: str = "root", timers: Timers | None = None,
          timeout: float = 120, report: Reporter = silent, boot_hook: str | None = None,
          probe_timeout: float = 60) -> SlurmSettings:
    """Slurm on the cluster ``link`` reaches: returns its settings once every node is idle and srun works."""
    layout = layout or private_layout()
    record = link.record
    compute = {n.name for n in compute_nodes(record, leader_compute)}
    nodes = [n for n in record.ordered_nodes() if n.name in compute or n.is_leader]
    probes = {p.node: p for p in probe(link, nodes, layout, standin_gpus, timeout=probe_timeout).values()}
    sizes = {name: (p.size, p.gpus) for name, p in probes.items()}
    settings = settings_for(record, sizes, layout, leader_compute=leader_compute, cgroups=cgroups,
                            slurm_user=slurm_user, timers=timers)
    release = slurmtext.release_text(next(iter(probes.values())).version)
    settings = dataclasses.replace(settings, release=release)
    report(f"slurm {release}: {len(settings.nodes)} node(s) {settings.hostlist} in partition {settings.partition}")
    install(link, settings, key, standin_gpus=standin_gpus, report=report, boot_hook=boot_hook)
    deadline = time.monotonic() + timeout
    wait_idle(link, settings, timeout)
    check_srun(link, settings, max(10.0, deadline - time.monotonic()))
    # idle again: the nodes end srun's job in `completing` (its epilog and cleanup), longer on a loaded machine
    wait_idle(link, settings, max(10.0, deadline - time.monotonic()))
    report(f"slurm: every node idle, srun -N{len(settings.nodes)} true ran")
    return settings


def stop(link: Link, layout: Layout, nodes: Sequence[Node] | None = None, timeout: float = 60) -> list[str]:
    """Stop slurmd, slurmctld and munged where they run (pid files); returns what is left running."""
    targets = list(nodes) if nodes is not None else link.record.ordered_nodes()
    result = run_on_nodes(link, targets, root_shell(link), timeout=timeout,
                          stdin_data=nodescript.stop_script(layout).encode())
    left = [f"{r.node}: {line[len('left '):]}" for r in result.results for line in r.stdout.splitlines()
            if line.startswith("left ")]
    return left + [f"{r.node}: {r.reason}" for r in result.failed()]
