"""Findings: what a rule reports. Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

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


def _location_json(loc: Location | None) -> dict | None:
    if loc is None:
        return None
    out: dict = location_json(loc.path, loc.line)  # a notebook's: with cell, cell_line
    if loc.via:  # called through a training framework; in that user hook of theirs
        out["via"] = loc.via
    if loc.hook:
        out["hook"] = loc.hook
    return out


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
    # the fix in a training framework's terms, keyed by framework; the analysis swaps one in for
    # ``fix`` when the finding came through that framework (rules/engine.py)
    fixes: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict:
        out = {
            "rule": self.rule,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "location": _location_json(self.location),
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
