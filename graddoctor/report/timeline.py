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
    steps: list[int] = field(default_factory=list)

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
    """Distinct update shapes, in order of first appearance, with how often each was seen."""
    by_key: dict[tuple, Shape] = {}
    for update in updates(a):
        shape = Shape(update.items)
        shape = by_key.setdefault(shape.key, shape)
        shape.updates += 1
        shape.steps.extend(update.steps)
    return list(by_key.values())


def step_ranges(steps: list[int]) -> str:
    """[1, 2, 3, 5] -> '1–3, 5'."""
    parts: list[str] = []
    numbers = sorted(set(steps))
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(str(numbers[i]) if i == j else f"{numbers[i]}–{numbers[j]}")
        i = j + 1
    return ", ".join(parts)
