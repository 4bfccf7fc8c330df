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
    if not groups:
        return []
    group = max(groups.values(), key=len)
    return _with_split_micro_batches(group, backwards)


def _with_split_micro_batches(group: list[Event], backwards: list[Event]) -> list[Event]:
    """The group and the backwards of the same loop written at another line: the micro-batches
    of one window split between two branches (``with model.no_sync(): loss.backward()`` on all
    but the last, ``loss.backward()`` on the last). Such a backward wrote the same parameters,
    with the same loss factor and terms, on a DataLoader batch none of the group's used; a
    second loss term (an auxiliary loss, a GAN's fake half) runs on a batch already used, or
    on none the trace knows."""
    first = group[0]
    shape = (frozenset(written(first)), first.get("loss_scale_factor"), _terms(first))
    batches = [b.get("batch") for b in group]
    if shape[1] is None or any(batch is None for batch in batches) or \
            any(_shape(b) != shape for b in group):
        return group
    used = {tuple(batch) for batch in batches}
    extra = []
    for b in backwards:
        if b in group:
            continue
        batch = b.get("batch")
        if batch is None or tuple(batch) in used or _shape(b) != shape:
            return group  # another kind of backward in the window: leave the lines apart
        used.add(tuple(batch))
        extra.append(b)
    return sorted(group + extra, key=lambda b: b.seq) if extra else group


def _terms(backward: Event):
    terms = backward.get("loss_terms")
    return tuple(terms) if isinstance(terms, list) else terms


def _shape(backward: Event) -> tuple:
    return (frozenset(written(backward)), backward.get("loss_scale_factor"), _terms(backward))


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
