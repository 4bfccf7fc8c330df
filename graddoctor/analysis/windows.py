"""Accumulation windows: which backward calls (and which DataLoader batches) each optimizer
step applied, read from the ledger. Pure Python over the ``Analysis``; no torch.

A step's *window* is every backward whose contribution it consumed. The *accumulating group* of a
window is the largest set of its backwards that ran at the same line and wrote the same
parameters (the ``loss.backward()`` of a micro-batch loop); its size is the window's ``k``.
Two losses backward'ed at two lines (a GAN's real/fake terms, an auxiliary loss) are not
accumulation. The factor k of a loop is the most common window k (ties: the smaller).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..trace import Event
from .basics import written

if TYPE_CHECKING:
    from . import Analysis


@dataclass
class Window:
    step: Event
    index: int  # 1-based step number in the replay (GradScaler-skipped steps included)
    opt: int
    backwards: list[Event]
    group: list[Event] = field(default_factory=list)  # the accumulating group

    @property
    def k(self) -> int:
        return len(self.group)

    def batches(self) -> list[tuple]:
        """Distinct DataLoader batches ``(loader, epoch, index)`` the window's backwards used."""
        seen: dict[tuple, None] = {}
        for b in self.backwards:
            batch = b.get("batch")
            if batch is not None:
                seen.setdefault(tuple(batch), None)
        return list(seen)

    def straddles(self) -> bool:
        """Its batches come from two epochs of one loader."""
        epochs: dict[int, set[int]] = {}
        for loader, epoch, _ in self.batches():
            epochs.setdefault(loader, set()).add(epoch)
        return any(len(e) > 1 for e in epochs.values())


def _group(backwards: list[Event]) -> list[Event]:
    groups: dict[tuple, list[Event]] = {}
    for b in backwards:
        loc = (b.loc.path, b.loc.line) if b.loc else None
        groups.setdefault((loc, frozenset(written(b))), []).append(b)
    return max(groups.values(), key=len) if groups else []


def windows_by_optimizer(a: "Analysis") -> dict[int, list[Window]]:
    led = a.ledger
    out: dict[int, list[Window]] = {}
    for step in a.steps:
        index = a.step_number[step.seq]
        backwards = led.windows.get(step.seq, [])
        if not backwards:
            continue
        if step.get("closure") and sum(b.get("in_step") is not None for b in backwards) != 1:
            # L-BFGS: the closure's backwards are re-evaluations, not micro-batches; a closure
            # that ran one backward (Lightning's automatic optimization) ends a window as a
            # plain step does
            continue
        out.setdefault(step["opt"], []).append(
            Window(step, index, step["opt"], backwards, _group(backwards)))
    return out


def typical(values, weights=None) -> int | None:
    """The most common value (ties: the smaller); None when there is none. ``weights``: how
    many times each value counts (``Analysis.weight`` of its window's step in a folded run)."""
    counts: Counter = Counter()
    for value, weight in zip(values, weights) if weights is not None else ((v, 1) for v in values):
        counts[value] += weight
    if not counts:
        return None
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)
