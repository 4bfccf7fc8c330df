"""The result of a check: run facts + findings. Pure data; the formats render it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..findings import Finding, Severity

SCHEMA_VERSION = 1


@dataclass
class RunInfo:
    script: str
    argv: list[str]
    status: str
    steps: int = 0
    backward_calls: int = 0
    device: str = "cpu"
    torch_version: str = ""
    duration_s: float = 0.0
    error: dict | None = None
    notes: list[str] = field(default_factory=list)
    step_budget: int | None = None  # --steps (None: run to the end)
    config: str | None = None  # the pyproject.toml whose [tool.graddoctor] applied
    world_size: int = 1  # processes of a distributed run (torchrun's WORLD_SIZE)
    # one entry per process whose report is merged in (ranks, spawned workers), else None:
    # {rank (int or None), process (a label), pid, status, steps, backward_calls, error}
    ranks: list[dict] | None = None
    # replica checksums of a rank's first steps (instrument/ddp.py), for the merge to compare:
    # [{opt, step, value, path, line}]; only in a rank's own report
    checksums: list[dict] | None = None


@dataclass
class Report:
    run: RunInfo
    findings: list[Finding]
    internal_errors: list[dict] = field(default_factory=list)
    analysis: Any = None  # the Analysis of the trace, for views (update timeline, grad flow)

    @property
    def trace(self):
        """The recorded events (``--trace``), or None."""
        return self.analysis.trace if self.analysis is not None else None

    def active(self) -> list[Finding]:
        return [f for f in self.findings if not f.suppressed]

    def summary(self) -> dict[str, int]:
        counts = {"error": 0, "warning": 0, "info": 0}
        for f in self.active():
            counts[f.severity.value] += 1
        return counts

    def suppressed(self) -> list[Finding]:
        return [f for f in self.findings if f.suppressed]

    def could_not_check(self) -> bool:
        """Nothing to judge: the script failed or had no loop before a single step."""
        if self.run.status == "no-training-loop":
            return True
        return self.run.status in ("crashed", "timeout") and self.run.steps == 0 \
            and self.run.backward_calls == 0

    def exit_code(self, fail_on: str) -> int:
        if self.could_not_check():
            return 2
        if fail_on == "never":
            return 0
        threshold = Severity(fail_on).rank
        return 1 if any(f.severity.rank >= threshold for f in self.active()) else 0
