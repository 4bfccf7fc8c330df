"""The turns of the training loop: the user's calls in the order they ran, cut into one turn of
the loop body at a time (the report's update timeline shows them). No torch.

Generic over event kinds: any event with a location that is not set-up or a per-forward detail
becomes a call, labelled from ``events.CALL_LABELS`` (unknown kinds show their own name), so new watchers
appear in the timeline without a change.

A turn ends after its optimizer step(s), at the first later call that starts the loop's next
turn: one at an earlier or equal line of the same file (the loop jumped back), or one already seen
in this turn (a repeat). So ``zero_grad`` at the top of the loop opens the next turn while
``scheduler.step()`` after ``optimizer.step()`` closes the current one; a GAN's two steps in one
loop body are one turn. A tail without any optimizer step is not a turn.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..events import ABSORBS, CALL_LABELS, NOT_CALLS, is_per_forward
from ..notebook import cell_of
from ..trace import Event, Location

if TYPE_CHECKING:
    from . import Analysis

# Kinds that apply an update (a GradScaler step that skipped the optimizer still ends one).
UPDATE_KINDS = {"step", "scaler_step"}


def label_of(event: Event) -> str | None:
    if event.loc is None or event.kind in NOT_CALLS or is_per_forward(event.kind):
        return None
    if event.kind == "backward" and "allreduce" in event.data:  # DDP: synced or not
        return "backward + all-reduce" if event.data["allreduce"] else "backward (no_sync)"
    return CALL_LABELS.get(event.kind, event.kind)


@dataclass
class Item:
    """One call (same-line neighbours merged); in the report, also a repeated call or block."""

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
    """``L22``, ``model.py:22``, ``c5:L4`` (a notebook's cell 5, line 4); a call a framework
    made for the user's hook names the hook: ``L17 (training_step)``."""
    where = cell_of(loc.path, loc.line)
    line = f"c{where[0]}:L{where[1]}" if where else f"L{loc.line}"
    place = line if loc.path == home else f"{os.path.basename(loc.path)}:{line.lstrip('L')}"
    return f"{place} ({loc.hook})" if loc.hook else place


@dataclass
class Turn:
    items: list[Item]  # the calls, in order
    steps: list[int]  # 1-based optimizer step numbers applied in this turn


def calls(a: "Analysis") -> list[tuple[Item, list[int]]]:
    """One item per labelled event (same-line neighbours merged), with the step numbers it holds."""
    return [(item, steps) for item, steps, _ in _calls(a)]


def _calls(a: "Analysis") -> list[tuple[Item, list[int], int]]:
    """``calls`` with the seq of each item's first event."""
    out: list[tuple[Item, list[int], int]] = []
    for event in a.events:
        label = label_of(event)
        if label is None:
            continue
        step_numbers = [a.step_number[event.seq]] if event.kind == "step" else []
        if out and (out[-1][0].loc.path, out[-1][0].loc.line) == (event.loc.path, event.loc.line) \
                and _same_call(out[-1][0].label, label):
            prev, prev_steps, seq = out[-1]
            keep = prev.label if label in ABSORBS.get(prev.label, ()) else label
            out[-1] = (Item(keep, prev.loc, prev.kinds + (event.kind,)), prev_steps + step_numbers,
                       seq)
            continue
        out.append((Item(label, event.loc, (event.kind,)), step_numbers, event.seq))
    return out


def _inside_updates(a: "Analysis") -> list[tuple[int, int]]:
    """The (first, last) step seqs of each update that took several optimizer steps: a step
    begins a new update after a backward or when its optimizer already stepped in the running
    one (as the step budget counts, instrument/recorder.py). One optimizer per parameter stepped
    inside the backward is one update, not 24 turns."""
    spans: list[tuple[int, int]] = []
    first = last = None
    backward_since, opts = True, set()
    for event in a.events:
        if event.kind == "backward":
            backward_since = True
        elif event.kind == "step":
            opt = event.get("opt")
            if backward_since or opt in opts:
                if first is not None and last != first:
                    spans.append((first, last))
                first, opts, backward_since = event.seq, set(), False
            opts.add(opt)
            last = event.seq
    if first is not None and last != first:
        spans.append((first, last))
    return spans


def _same_call(a: str, b: str) -> bool:
    return b in ABSORBS.get(a, ()) or a in ABSORBS.get(b, ())


def _starts_next(prev: Item, item: Item, seen: set) -> bool:
    jumped_back = prev.loc.path == item.loc.path and item.loc.line < prev.loc.line
    return jumped_back or (item.label, item.loc.path, item.loc.line) in seen


def turns(a: "Analysis") -> list[Turn]:
    """The replay cut into turns of the loop."""
    result: list[Turn] = []
    items: list[Item] = []
    steps: list[int] = []
    seen: set = set()
    applied = False  # this turn has reached its optimizer step
    spans = _inside_updates(a)
    span = 0
    for item, step_numbers, seq in _calls(a):
        while span < len(spans) and spans[span][1] < seq:
            span += 1
        within = span < len(spans) and spans[span][0] < seq <= spans[span][1]
        if applied and not within and _starts_next(items[-1], item, seen):
            result.append(Turn(items, steps))
            items, steps, seen, applied = [], [], set(), False
        elif applied and step_numbers and _another_loop(items, item):
            # the script's next loop (fine-tuning after pre-training): its calls so far open
            # the next turn, not the tail of this loop's last one
            cut = _tail_start(items)
            result.append(Turn(items[:cut], steps))
            items = items[cut:]
            steps, applied = [], False
            seen = {(i.label, i.loc.path, i.loc.line) for i in items}
        items.append(item)
        seen.add((item.label, item.loc.path, item.loc.line))
        steps.extend(step_numbers)
        applied = applied or bool(UPDATE_KINDS.intersection(item.kinds))
    if applied:
        result.append(Turn(items, steps))
    return result


# calls that close an update rather than open the next one (scheduler.step() after the step)
CLOSING_KINDS = {"scheduler_step", "scaler_update"}


def _last_step(items: list[Item]) -> Item | None:
    return next((i for i in reversed(items) if "step" in i.kinds), None)


def _another_loop(items: list[Item], item: Item) -> bool:
    """Whether the optimizer step ``item`` lies in another loop of the same file than this
    turn's step: a GAN's two steps share a loop body, two training loops in a row do not."""
    from .source import innermost_loop

    last = _last_step(items)
    if last is None or last.loc.path != item.loc.path:
        return False
    here, there = innermost_loop(last.loc.path, last.loc.line), \
        innermost_loop(item.loc.path, item.loc.line)
    return here is not None and there is not None and here != there \
        and not (there[0] <= here[0] and here[1] <= there[1])  # not an outer loop of it


def _tail_start(items: list[Item]) -> int:
    """Where the calls after this turn's last update begin (closing calls such as a scheduler's
    step stay with it)."""
    last = max(n for n, i in enumerate(items) if UPDATE_KINDS.intersection(i.kinds))
    cut = last + 1
    while cut < len(items) and set(items[cut].kinds) <= CLOSING_KINDS:
        cut += 1
    return cut


def main_path(a: "Analysis") -> str | None:
    """The file most of the user's calls are in: the timeline shows it as bare ``L42``."""
    counts = Counter(e.loc.path for e in a.events if label_of(e) is not None)
    return counts.most_common(1)[0][0] if counts else None
