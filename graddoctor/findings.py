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


class Role(str, Enum):
    """What a related location is to its finding, for code that acts on it (a rule's autofix
    finds the line to move or to insert before by its role, never by the wording of its note).
    Written in the JSON report as ``roles``."""

    BACKWARD = "backward"  # the backward whose gradients the finding is about
    LEAKING_BACKWARD = "leaking-backward"  # another loss's backward leaking into this step
    SCALED_BACKWARD = "scaled-backward"  # the backward of a GradScaler-scaled loss
    STEP = "step"  # the optimizer step that applies (or should have applied) the gradients
    FIRST_STEP = "first-step"  # an optimizer's first step
    UNSCALE = "unscale"  # scaler.unscale_
    CLIP = "clip"  # a gradient clip
    HELPER_CALL = "helper-call"  # the call, in the loop, of the user's helper that holds the line
    TRAIN_CALL = "train-call"  # model.train() that left a module in train mode
    TRAINING_FORWARD = "training-forward"  # a forward that trains (its mode is the finding)
    FREEZE = "freeze"  # where parameters were frozen


@dataclass(frozen=True)
class Related:
    """A line that explains a finding: ``note`` for the reader, ``roles`` for code (an
    entry that joins two notes on one line has both roles)."""

    location: Location
    note: str
    roles: tuple[Role, ...] = ()


class Safety(str, Enum):
    """How far an automatic edit can be trusted (as ruff says it): ``safe`` cannot change what
    correct code does; ``unsafe`` changes behaviour in a way a person should judge."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class Edit:
    """Replace the text from (line, col) to (end_line, end_col) of ``path`` with ``text``.
    Lines from 1, columns from 0 in characters, the end exclusive: an insertion has
    start == end; a whole line is (n, 0) to (n + 1, 0)."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    text: str


# a fix's verification (graddoctor check --diff/--fix re-runs the fixed script): the finding is
# gone and nothing new appeared / it is still there / the fixed script got a new finding
VERIFIED = "fixed"
NOT_FIXED = "not fixed"
INTRODUCED = "fix introduced a finding"


@dataclass(frozen=True)
class Autofix:
    """A finding's mechanical fix: the edits (built from the source with libcst, formatting
    and comments kept), their safety, and — after ``--diff``/``--fix`` — its verification.
    ``refused`` (no edits): why graddoctor offers no edit for this finding (a notebook, code a
    training framework drives)."""

    title: str
    safety: Safety
    edits: tuple[Edit, ...] = ()
    refused: str = ""
    verification: str | None = None  # None: not verified; else VERIFIED, NOT_FIXED, INTRODUCED
    verification_note: str = ""  # e.g. the finding the fix introduced, or why it was not run
    digest: str = ""  # sha256 of the file's text the edits were computed on

    @property
    def verified(self) -> bool:
        return self.verification == VERIFIED


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
    # the edit that fixes it, for the rules whose fix is mechanical (Rule.autofix)
    autofix: Autofix | None = None


@dataclass(frozen=True)
class ProcessFacts:
    """What the merge of a run's processes (the ranks of a distributed run, spawned workers)
    knows of one of them, for the rules that compare processes (``Rule.check_processes``)."""

    rank: int | None  # None: a process without a rank ("main process", a worker)
    process: str  # "rank 1", "main process", "spawned pid 4242"
    # parameter checksums after each optimizer's first steps (instrument/ddp.py):
    # {opt, step, value, path, line}
    checksums: tuple[Mapping[str, Any], ...] = ()
    # fingerprints of the first batches that fed a backward (instrument/dataloader.py):
    # {loader, epoch, index, value, sampler, replicas, path, line}
    batch_fingerprints: tuple[Mapping[str, Any], ...] = ()


def spans(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"0–2, 5"``: ranks as the report writes them."""
    ranks = sorted(set(ranks))
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(r) if start == r else f"{start}–{r}")
            start = None
    return ", ".join(out)
