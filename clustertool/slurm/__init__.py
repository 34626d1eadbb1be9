"""Slurm on a cluster: clustertool drives the scheduler teams already run instead of growing its own.

Pure parts, unit-tested against saved output of Slurm 21.08, 22.05 and 23.11:

- ``layout``     where Slurm's and munge's files live on a node (a private folder on local nodes,
                 whose /etc is this machine's; the usual system paths elsewhere)
- ``slurmconf``  slurm.conf, gres.conf and cgroup.conf, written from a cluster record and what each
                 node's ``slurmd -C`` says
- ``slurmcmd``   argv for sinfo, squeue, scontrol, sbatch, srun, scancel, sacct (fixed text formats:
                 ``scontrol --json`` does not exist in 22.05 and the JSON shapes change between releases)
- ``slurmtext``  parsers of those formats
- ``munge``      the cluster's munge key (made on the user's machine, sent on stdin, 0400 on nodes)
                 and munged's argv

Side effects: ``bringup`` installs and starts munged, slurmctld and slurmd on a cluster's nodes
through its session (remote shells, ``nodeprogs/slurm_node.sh``) and waits until every node is idle
and ``srun -N<all> true`` works.
"""

from __future__ import annotations

from clustertool.core.errors import ToolError


class SlurmError(ToolError):
    """Slurm or munge on the cluster did not do what was asked (the message names the node)."""
