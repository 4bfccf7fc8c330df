"""The turns of the training loop: the user's calls in the order they ran, cut into one turn of
the loop body at a time (the report's update timeline shows them). No torch.

Generic over event kinds: any event with a location that is not set-up or a per-forward detail
becomes a call, labelled from ``LABELS`` (unknown kinds show their own name), so new watchers
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

from ..events import ASIDE_KINDS
from ..notebook import cell_of
from ..trace import Event, Location

if TYPE_CHECKING:
    from . import Analysis

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
    "ddp_no_sync": "no_sync",
    "compile": "compile",
}
# Never calls: set-up, bookkeeping, the numeric summary that accompanies a step.
SKIP = {"run_start", "run_end", "param", "optimizer_init", "internal_error", "step_begin",
        "sampler_iter",  # a DistributedSampler's epoch: the DataLoader's epoch shows already
        "replica_checksum",  # bookkeeping after a step
        "folded",  # stands for turns the recorder folded out; the timeline counts them apart
        "mode_module", *ASIDE_KINDS}  # aside kinds: details of a forward or a loss call
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
    if event.kind == "backward" and "allreduce" in event.data:  # DDP: synced or not
        return "backward + all-reduce" if event.data["allreduce"] else "backward (no_sync)"
    return LABELS.get(event.kind, event.kind)


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
    out: list[tuple[Item, list[int]]] = []
    for event in a.events:
        label = label_of(event)
        if label is None:
            continue
        step_numbers = [a.step_number[event.seq]] if event.kind == "step" else []
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


def turns(a: "Analysis") -> list[Turn]:
    """The replay cut into turns of the loop."""
    result: list[Turn] = []
    items: list[Item] = []
    steps: list[int] = []
    seen: set = set()
    applied = False  # this turn has reached its optimizer step
    for item, step_numbers in calls(a):
        if applied and _starts_next(items[-1], item, seen):
            result.append(Turn(items, steps))
            items, steps, seen, applied = [], [], set(), False
        items.append(item)
        seen.add((item.label, item.loc.path, item.loc.line))
        steps.extend(step_numbers)
        applied = applied or bool(UPDATE_KINDS.intersection(item.kinds))
    if applied:
        result.append(Turn(items, steps))
    return result


def main_path(a: "Analysis") -> str | None:
    """The file most of the user's calls are in: the timeline shows it as bare ``L42``."""
    counts = Counter(e.loc.path for e in a.events if label_of(e) is not None)
    return counts.most_common(1)[0][0] if counts else None
