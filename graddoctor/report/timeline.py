"""The observed order of calls, one *update* at a time, grouped into distinct shapes.

    zero_grad L20 → backward L22 → clip L23 → step L24 → sched.step L25      ×9 (steps 2–10)

Generic over event kinds: any event with a location that is not set-up or a per-forward detail
becomes an item, labelled from ``LABELS`` (unknown kinds show their own name), so new watchers
appear here without a change. No torch, no rich: plain data for the views.

An update ends after its optimizer step(s), at the first later event that starts the loop's next
turn: one at an earlier or equal line of the same file (the loop jumped back), or one already seen
in this update (a repeat). So ``zero_grad`` at the top of the loop opens the next update while
``scheduler.step()`` after ``optimizer.step()`` closes the current one; a GAN's two steps in one
loop body are one update.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from ..trace import Event, Location, Trace

# Short label per event kind; extend it when you add a kind worth naming differently.
LABELS = {
    "backward": "backward",
    "clear": "zero_grad",
    "step": "step",
    "clip": "clip",
    "unscale": "unscale",
    "scale": "scale",
    "scaler_scale": "scale",
    "scaler_step": "scaler.step",
    "scaler_update": "scaler.update",
    "scheduler_step": "sched.step",
    "train": "train()",
    "eval": "eval()",
    "epoch_start": "epoch",
    "freeze": "requires_grad_(False)",
    "bn_reset": "reset_running_stats()",
    "update_bn": "update_bn()",
    "grad_edit": "grad edit",
}
# Never items: set-up, bookkeeping, the numeric summary that accompanies a step.
SKIP = {"run_start", "run_end", "param", "optimizer_init", "internal_error", "step_begin",
        "mode_module"}
# A call that makes another one internally at the same line shows once: scaler.step(opt) runs
# unscale_ (when the user did not) and optimizer.step(); scaler.scale(loss).backward() is one call.
ABSORBS = {"scaler.step": {"step", "unscale"}, "backward": {"scale"}}
# Kinds that apply an update (a GradScaler step that skipped the optimizer still ends one).
UPDATE_KINDS = {"step", "scaler_step"}


def is_per_forward(kind: str) -> bool:
    """Forward passes of modules (BatchNorm, dropout, ...) happen many times per update."""
    return "forward" in kind


def label_of(event: Event) -> str | None:
    if event.loc is None or event.kind in SKIP or is_per_forward(event.kind):
        return None
    return LABELS.get(event.kind, event.kind)


@dataclass
class Item:
    label: str
    loc: Location
    kinds: tuple[str, ...]
    count: int = 1  # consecutive repeats: "backward L22 ×4"
    group: tuple["Item", ...] = ()  # a repeated block: "(zero_grad L13 → backward L15) ×4"

    @property
    def key(self) -> tuple:
        if self.group:
            return ("group", tuple(i.key for i in self.group), self.count)
        return (self.label, self.loc.path, self.loc.line, self.count)

    def plain(self, home: str | None = None) -> str:
        """``backward L22 ×4`` (``file.py:22`` outside the ``home`` file)."""
        times = f" ×{self.count}" if self.count > 1 else ""
        if self.group:
            return "(" + " → ".join(i.plain(home) for i in self.group) + ")" + times
        return f"{self.label} {place(self.loc, home)}{times}"


def place(loc: Location, home: str | None) -> str:
    return f"L{loc.line}" if loc.path == home else f"{os.path.basename(loc.path)}:{loc.line}"


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


def _raw_items(trace: Trace) -> list[tuple[Item, list[int]]]:
    """One item per labelled event (same-line neighbours merged), with the step numbers it holds."""
    out: list[tuple[Item, list[int]]] = []
    steps_seen = 0
    for event in trace.events:
        label = label_of(event)
        if label is None:
            continue
        step_numbers = []
        if event.kind == "step":
            steps_seen += 1
            step_numbers.append(steps_seen)
        if out and (out[-1][0].loc.path, out[-1][0].loc.line) == (event.loc.path, event.loc.line) \
                and _same_call(out[-1][0].label, label):
            prev, prev_steps = out[-1]
            keep = prev.label if label in ABSORBS.get(prev.label, ()) else label
            out[-1] = (Item(keep, prev.loc, prev.kinds + (event.kind,)), prev_steps + step_numbers)
            continue
        out.append((Item(label, event.loc, (event.kind,)), step_numbers))
    return out


def _same_call(a: str, b: str) -> bool:
    return b in ABSORBS.get(a, ()) or a in ABSORBS.get(b, ())


def _starts_next(prev: Item, item: Item, seen: set) -> bool:
    jumped_back = prev.loc.path == item.loc.path and item.loc.line < prev.loc.line
    return jumped_back or (item.label, item.loc.path, item.loc.line) in seen


def updates(trace: Trace) -> list[Update]:
    """The replay cut into updates; a tail without any optimizer step is dropped."""
    result: list[Update] = []
    items: list[Item] = []
    steps: list[int] = []
    seen: set = set()
    applied = False  # this update has reached its optimizer step
    for item, step_numbers in _raw_items(trace):
        if applied and _starts_next(items[-1], item, seen):
            result.append(Update(_collapse(items), steps))
            items, steps, seen, applied = [], [], set(), False
        items.append(item)
        seen.add((item.label, item.loc.path, item.loc.line))
        steps.extend(step_numbers)
        applied = applied or bool(UPDATE_KINDS.intersection(item.kinds))
    if applied:
        result.append(Update(_collapse(items), steps))
    return result


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


def shapes(trace: Trace) -> list[Shape]:
    """Distinct update shapes, in order of first appearance, with how often each was seen."""
    by_key: dict[tuple, Shape] = {}
    for update in updates(trace):
        shape = Shape(update.items)
        shape = by_key.setdefault(shape.key, shape)
        shape.updates += 1
        shape.steps.extend(update.steps)
    return list(by_key.values())


def main_path(trace: Trace) -> str | None:
    """The file most events point at: shown as bare ``L42``; others as ``file.py:42``."""
    counts = Counter(e.loc.path for e in trace.events if label_of(e) is not None)
    return counts.most_common(1)[0][0] if counts else None


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
