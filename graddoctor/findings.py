"""Findings: what a rule reports. Plain data, no torch; the JSON report writes and reads them
(report/json_format.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from .trace import Location


class Severity(str, Enum):
    """A claim about certainty: error = the update is wrong; warning = very likely wrong;
    info = worth knowing."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 1, "warning": 2, "error": 3}[self.value]


@dataclass(frozen=True)
class Related:
    location: Location
    note: str


@dataclass(frozen=True)
class Finding:
    rule: str  # slug, e.g. "missing-zero-grad"
    code: str  # e.g. "GD101"
    severity: Severity
    message: str
    # the user's line; None only when the call it points at ran with no frame of the user's
    # code on the stack (an event without a location). Rules never invent one.
    location: Location | None
    fix: str = ""
    related: tuple[Related, ...] = ()
    step: int | None = None  # the optimizer step (1-based, in replay order) where it was seen
    evidence: dict[str, Any] = field(default_factory=dict)
    suppressed: bool = False
    # a report merged from several processes (ranks of a distributed run, spawned workers):
    # the ranks that saw it, and the processes without a rank (e.g. "main process") that did
    ranks: tuple[int, ...] | None = None
    processes: tuple[str, ...] = ()
    # the fix in a training framework's terms, keyed by framework; the analysis swaps one in for
    # ``fix`` when the finding came through that framework (analysis/run_rules.py)
    fixes: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

