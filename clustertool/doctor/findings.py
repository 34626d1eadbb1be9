"""Doctor's data: findings and check results (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clustertool.core.model import jsonable

SEVERITIES = ("info", "warning", "error")


@dataclass
class Finding:
    check: str
    node: str | None  # None: the cluster as a whole
    severity: str  # info | warning | error
    message: str
    fix: str = ""  # what to do about it, concretely
    fixable: bool = False  # `doctor --fix` can do it safely
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def problem(self) -> bool:
        return self.severity in ("warning", "error")


@dataclass
class CheckResult:
    name: str
    findings: list[Finding] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        worst = [f.severity for f in self.findings if f.problem]
        return "error" if "error" in worst else "warning" if worst else "ok"


@dataclass
class AutoCordon:
    """What `doctor --cordon` did (its --json "cordon")."""

    cordoned: dict[str, str] = field(default_factory=dict)  # node -> reason, cordoned now
    already: list[str] = field(default_factory=list)  # found at error severity, cordoned before
    skipped: list[dict[str, str]] = field(default_factory=list)  # {node, why}: the leader
    hostfile: str | None = None
    leader_hostfile: str = "unchanged"
    slurm: str | None = None  # a Slurm cluster: the drains (or why not)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


@dataclass
class Diagnosis:
    """What `doctor` found on a cluster: every check's result, and the fixes applied."""

    cluster: str
    checks: list[CheckResult] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    cordoned: AutoCordon | None = None  # doctor --cordon: what it cordoned

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    @property
    def clean(self) -> bool:
        return not any(f.problem for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == "error" for f in self.findings) else 0
