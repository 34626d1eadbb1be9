"""What a user asks of `doctor`, as one typed value: built alike by the CLI and the API, checked once when
made (a bad value is one UsageError naming the flag, with a hint), handed whole to doctor.run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clustertool.core.errors import UsageError
from clustertool.doctor import gpu
from clustertool.doctor.bisect import DEFAULT_THRESHOLD
from clustertool.doctor.hwchecks import gpu_options

ALL_CHECKS = ("reach", "ssh-mesh", "disk", "sameness", "strays", "clock", "mpi-smoke", "network", "plugin-nccl",
              "gpu", "efa", "shared-fs", "slurm")
ALIASES = {"mesh": "ssh-mesh", "ssh": "reach", "mpi": "mpi-smoke", "links": "network", "link": "network",
           "gpus": "gpu", "shared": "shared-fs", "sharedfs": "shared-fs"}


def choose_checks(check: Sequence[str], skip: Sequence[str]) -> tuple[str, ...]:
    """The checks to run from --check/--skip values (repeated or comma-separated; short aliases
    like ``mesh``); an unknown name is a usage error."""
    def names(values: Sequence[str]) -> list[str]:
        out = [ALIASES.get(v.strip(), v.strip()) for value in values for v in value.split(",") if v.strip()]
        unknown = [c for c in out if c not in ALL_CHECKS]
        if unknown:
            raise UsageError(f"unknown check {unknown[0]!r}", hint=f"checks: {', '.join(ALL_CHECKS)}")
        return out

    wanted, skipped = names(check) or list(ALL_CHECKS), set(names(skip))
    return tuple(c for c in ALL_CHECKS if c in wanted and c not in skipped)


def check_threshold(threshold: float) -> None:
    """The network check's threshold is a fraction of the median: between 0 and 1."""
    if not 0 < threshold < 1:
        raise UsageError(f"--threshold {threshold} is not between 0 and 1",
                         hint="e.g. 0.8: a pair below 0.8 x the cluster's median bandwidth is slow")


@dataclass(frozen=True)
class DoctorRequest:
    """One `clustertool doctor`: which checks, the safe fixes, cordons, and each check's options."""

    checks: tuple[str, ...] = ALL_CHECKS
    fix: bool = False  # do the safe fixes, then check again
    cordon: bool = False  # cordon every node found at error severity
    plugin_path: str | None = None  # where the plugin is deployed on the nodes (for its checksum)
    disk_paths: tuple[str, ...] = ()  # besides home and the job logs (default /scratch)
    threshold: float = DEFAULT_THRESHOLD  # network: slow below this fraction of the median
    all_pairs: bool = False  # network: every pair instead of the search
    deep: int = 0  # gpu: DCGM diag level (0: none)
    since: str | None = None  # gpu: Xid events since this age or time (default: since boot)
    gpu_timeout: float = 60.0
    deep_timeout: float = 600.0
    nccl_log: str | None = None  # efa: the job or file whose NCCL INFO lines name the network NCCL used

    def __post_init__(self) -> None:
        check_threshold(self.threshold)
        unknown = [c for c in self.checks if c not in ALL_CHECKS]
        if unknown:
            raise UsageError(f"unknown check {unknown[0]!r}", hint=f"checks: {', '.join(ALL_CHECKS)}")
        self.gpu_options()

    def gpu_options(self) -> gpu.Options:
        """The gpu check's time boxes, DCGM level and kernel-log window."""
        return gpu_options(self.deep, self.since, self.gpu_timeout, self.deep_timeout)

    @classmethod
    def of(cls, check: Sequence[str] = (), skip: Sequence[str] = (), *, bisect: bool = False, fix: bool = False,
           cordon: bool = False, plugin_path: str | None = None, disk_paths: Sequence[str] = (),
           threshold: float = DEFAULT_THRESHOLD, all_pairs: bool = False, deep: int = 0, since: str | None = None,
           gpu_timeout: float = 60.0, deep_timeout: float = 600.0, nccl_log: str | None = None) -> "DoctorRequest":
        """The request from doctor's flags: ``check`` and ``skip`` (names or comma lists; default every
        check), or ``bisect`` (the network search alone)."""
        check_threshold(threshold)
        if bisect and (check or skip):
            raise UsageError("--bisect runs the network search alone: leave out --check and --skip",
                             hint="or add the search to other checks with --check ...,network")
        return cls(checks=("network",) if bisect else choose_checks(check, skip), fix=fix, cordon=cordon,
                   plugin_path=plugin_path, disk_paths=tuple(disk_paths), threshold=threshold, all_pairs=all_pairs,
                   deep=deep, since=since, gpu_timeout=gpu_timeout, deep_timeout=deep_timeout, nccl_log=nccl_log)
