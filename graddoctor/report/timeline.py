"""The update timeline the terminal report shows: each distinct order of calls once, with how
many turns of the loop had it.

    zero_grad L20 → backward L22 → clip L23 → step L24 → sched.step L25      ×9 (steps 2–10)

The turns and their calls come from the analysis (analysis/turns.py); this module only folds
repeats and groups equal shapes. No torch, no rich: plain data for the views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis import Analysis
from ..analysis.turns import Item, label_of, main_path, place  # noqa: F401  (re-exported for the views)


@dataclass
class Update:
    items: list[Item]
    steps: list[int]  # 1-based optimizer step numbers applied in this update


@dataclass
class Shape:
    items: list[Item]
    updates: int = 0
    steps: list = field(default_factory=list)  # step numbers, and ranges of folded ones

    @property
    def key(self) -> tuple:
        return tuple(i.key for i in self.items)


def updates(a: Analysis) -> list[Update]:
    """The replay's turns with repeated calls folded; a tail without any optimizer step is dropped."""
    return [Update(_collapse(t.items), list(t.steps)) for t in a.turns]


MAX_BLOCK = 4  # longest repeated block folded into "(a → b) ×n"


def _collapse(items: list[Item]) -> list[Item]:
    """Consecutive identical calls become one item with a count; then consecutive identical
    blocks of up to ``MAX_BLOCK`` items become one group (a zero_grad inside every micro-batch)."""
    out: list[Item] = []
    for item in items:
        if out and (out[-1].label, out[-1].loc) == (item.label, item.loc):
            out[-1].count += 1
        else:
            out.append(Item(item.label, item.loc, item.kinds))
    return _fold_blocks(out)


def _fold_blocks(items: list[Item]) -> list[Item]:
    keys = [i.key for i in items]
    out: list[Item] = []
    i = 0
    while i < len(items):
        best = (1, 1)  # (repeats, block size) covering the most items
        for size in range(2, MAX_BLOCK + 1):
            repeats = 1
            while keys[i + repeats * size: i + (repeats + 1) * size] == keys[i: i + size] \
                    and i + size <= len(keys):
                repeats += 1
            if repeats > 1 and repeats * size > best[0] * best[1]:
                best = (repeats, size)
        repeats, size = best
        if repeats > 1:
            first = items[i]
            out.append(Item(first.label, first.loc, first.kinds, repeats, tuple(items[i: i + size])))
        else:
            out.append(items[i])
        i += repeats * size
    return out


def shapes(a: Analysis) -> list[Shape]:
    """Distinct update shapes, in order of first appearance, with how often each was seen
    (the turns a long run folded out count for the shape of the turn they repeated)."""
    by_key: dict[tuple, Shape] = {}
    first_step: dict[int, Shape] = {}  # number of a turn's first step -> its shape
    of_step: dict[int, Shape] = {}  # step number -> the shape of its turn
    for update in updates(a):
        shape = Shape(update.items)
        shape = by_key.setdefault(shape.key, shape)
        shape.updates += 1
        shape.steps.extend(update.steps)
        if update.steps:
            first_step[update.steps[0]] = shape
        of_step.update((n, shape) for n in update.steps)
    if a.folded_steps:
        _add_folded(a, first_step, of_step)
    return list(by_key.values())


@dataclass(frozen=True)
class Among:
    """``count`` of the steps in ``steps`` (a fold that held turns of several shapes)."""

    count: int
    steps: range


def _add_folded(a: Analysis, first_step: dict, of_step: dict) -> None:
    """Each folded turn repeated a kept one: its shape gets the copies, and the steps the fold
    covered (all of them, or ``Among`` them when the fold held turns of other shapes too)."""
    for fold in a.of_kind("folded"):
        before = a.steps_before(fold.seq)
        covered = range(before + 1, before + 1 + fold.get("steps", 0))
        added: dict[int, list] = {}  # id(shape) -> [shape, its steps in this fold]
        for first, last, n in fold.get("copies", ()):
            numbers = [a.step_number[s.seq] for s in a.steps if first <= s.seq <= last]
            for number in numbers:
                shape = of_step.get(number)
                if shape is not None:
                    added.setdefault(id(shape), [shape, 0])[1] += n
                if number in first_step:
                    first_step[number].updates += n
        for shape, steps in added.values():
            if len(covered):
                shape.steps.append(covered if steps >= len(covered) else Among(steps, covered))


def step_ranges(steps: list) -> str:
    """[1, 2, 3, 5] -> '1–3, 5' (a ``range`` stands for all its numbers, an ``Among`` for some
    of them: '40 of 548–5998')."""
    among = [s for s in steps if isinstance(s, Among)]
    steps = [s for s in steps if not isinstance(s, Among)]
    spans = sorted((s.start, s.stop - 1) if isinstance(s, range) else (s, s)
                   for s in steps if not isinstance(s, range) or len(s))
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    parts = [(s, str(s) if s == e else f"{s}–{e}") for s, e in merged]
    parts += [(m.steps.start, f"{m.count} of {m.steps.start}–{m.steps.stop - 1}") for m in among]
    return ", ".join(text for _, text in sorted(parts, key=lambda p: p[0]))
