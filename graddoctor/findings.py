"""Findings: what a rule reports. Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .notebook import location_json
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

    def to_json(self) -> dict:
        return {**location_json(self.location.path, self.location.line), "note": self.note}


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

    def to_json(self) -> dict:
        out = {
            "rule": self.rule,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "location": (
                location_json(self.location.path, self.location.line) if self.location else None
            ),
            "related": [r.to_json() for r in self.related],
            "step": self.step,
            "evidence": self.evidence,
            "fix": self.fix,
            "suppressed": self.suppressed,
        }
        if self.ranks is not None or self.processes:
            out["ranks"] = list(self.ranks or ())
            out["processes"] = list(self.processes)
        return out
