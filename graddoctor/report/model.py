"""The result of a check: run facts + findings. Pure data, frozen once built (the run's session
builds it once, run/session.py); the formats render it.

``Report.render()``, ``to_json()``, ``str(report)`` and rich's ``print(report)`` are the public
way to show a report, so they stay on it, but the model does not know how: the formats attach
that (``Report.views``, set by report/formats.py, which the report package imports). What a
view needs from the run is recorded here when the report is built, never looked up later."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..findings import Finding, Severity
from ..status import INCOMPLETE_STATUSES, RunStatus

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunInfo:
    script: str
    argv: list[str]
    status: RunStatus  # a plain string (a report read back from JSON) is made one
    steps: int = 0
    backward_calls: int = 0
    device: str = "cpu"
    torch_version: str = ""
    duration_s: float = 0.0
    error: dict | None = None
    notes: list[str] = field(default_factory=list)
    step_budget: int | None = None  # --steps (None: run to the end)
    config: str | None = None  # the pyproject.toml whose [tool.graddoctor] applied
    # codes of the rules --select/--ignore left out, recorded by whoever built the report
    rules_skipped: list[str] = field(default_factory=list)
    world_size: int = 1  # processes of a distributed run (torchrun's WORLD_SIZE)
    # one entry per process whose report is merged in (ranks, spawned workers), else None:
    # {rank (int or None), process (a label), pid, status, steps, backward_calls, error}
    ranks: list[dict] | None = None
    # replica checksums of a rank's first steps (instrument/ddp.py), for the merge to compare:
    # [{opt, step, value, path, line}]; only in a rank's own report
    checksums: list[dict] | None = None
    # fingerprints of a rank's first batches that fed a backward (instrument/dataloader.py), for
    # the merge to compare: [{loader, epoch, index, value, sampler, replicas, path, line}]; only
    # in a rank's own report
    batch_fingerprints: list[dict] | None = None
    # updates replayed (what --steps counts: the steps after one backward count once); None
    # when not recorded (an older report, a merged one)
    updates: int | None = None
    # a rank's run as its launcher names it (torchrun's run id, SLURM's job.step), the same on
    # every rank: a merge takes only the reports of one run (run/ranks.py); None elsewhere
    run_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RunStatus(self.status))


@dataclass(frozen=True)
class Report:
    run: RunInfo
    findings: list[Finding]
    internal_errors: list[dict] = field(default_factory=list)
    analysis: Any = None  # the Analysis of the trace, for views (update timeline, grad flow)
    fail_on: str = "warning"  # the exit code's threshold (--fail-on)
    allow_incomplete: bool = False  # an incomplete check exits by its findings (--allow-incomplete)
    # the folder relative paths are relative to: where the check started (None: the working
    # directory), also for a report written while the script is in another directory
    base_dir: str | None = None

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
        if self.run.status is RunStatus.NO_TRAINING_LOOP:
            return True
        return self.run.status in INCOMPLETE_STATUSES and self.run.steps == 0 \
            and self.run.backward_calls == 0

    def at_or_above(self, fail_on: str) -> list[Finding]:
        """The active findings at least as severe as ``fail_on`` (error, warning, info; never:
        none): those that fail a check."""
        if fail_on == "never":
            return []
        threshold = Severity(fail_on).rank
        return [f for f in self.active() if f.severity.rank >= threshold]

    def incomplete(self) -> bool:
        """The script stopped on its own failure after its first backward or step: the
        findings cover only the part that ran (``INCOMPLETE_STATUSES``)."""
        return self.run.status in INCOMPLETE_STATUSES and not self.could_not_check()

    def exit_code(self, fail_on: str | None = None) -> int:
        """2: could not check, or (unless ``allow_incomplete``) incomplete; 1: a finding at or
        above ``fail_on`` (the report's own threshold when not given); else 0."""
        fail_on = fail_on or self.fail_on
        if self.could_not_check() or (self.incomplete() and not self.allow_incomplete):
            return 2
        return 1 if self.at_or_above(fail_on) else 0

    # -- showing it: the formats do it (report/formats.py attaches them as ``views``) ----------
    views: ClassVar[Any] = None

    def render(self, format: str = "text", *, grad_flow: bool = False) -> str:
        """The report as the CLI writes it to a file: ``text`` (plain, no colours), ``json``,
        ``sarif``, ``html`` or ``markdown``."""
        return self.views.render(self, format, grad_flow=grad_flow)

    def to_json(self) -> dict:
        """The JSON report (``--format json``) as a dict."""
        return self.views.to_json(self)

    def __str__(self) -> str:
        return self.render("text")

    def _repr_html_(self) -> str:
        """A notebook shows the HTML report: findings, the gradient-flow heatmap, the timeline."""
        return self.views.html(self)

    def __rich__(self):
        """Rich renders it (``rich.print(report)``, a notebook's output): the terminal view."""
        return self.views.rich(self)
