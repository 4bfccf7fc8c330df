from __future__ import annotations

import re

from ..findings import Severity
from .base import Rule

_ONE_GROUP = re.compile(r"param_groups\s*\[\s*(-?\d+)\s*\]")
_MOVES = 2  # distinct lr changes of the scheduled group that tell a schedule


class LrScheduleSkipsGroups(Rule):
    """
    ## What it does
    Finds a learning-rate schedule written by hand that reaches only some of an optimizer's
    param groups: the script assigns `optimizer.param_groups[0]["lr"] = ...` inside the loop
    (a warm-up, a cosine, a step decay), the optimizer has other groups (a head at a higher lr,
    a no-decay group, a second model), and their lr never moves. Read from the lr each step
    applied (recorded for every group) and the line that wrote it.

    ## Why is this bad?
    The other groups train at their initial lr for the whole run: no warm-up protects them at
    the start and no decay lets them settle at the end. With a head at 10x the backbone's lr,
    the head keeps its large steps while the backbone anneals to nothing; with AdamW's no-decay
    group split out, the biases and norms never anneal. Nothing fails; the final loss is just
    worse, and the schedule the script prints (group 0's) is not the one most of the model got.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        optimizer.param_groups[0]["lr"] = base_lrs[0] * schedule(step)
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * schedule(step)
    ```

    ## Stays silent on
    A loop over every group; a torch scheduler (it scales every group); a group held at lr 0
    (frozen on purpose); optimizers with one group; a group whose lr the script writes apart on
    another line; a schedule that moved the lr less than twice in the steps graddoctor ran.
    """

    code = "GD195"
    slug = "lr-schedule-skips-groups"
    severity = Severity.WARNING
    summary = ("a hand-written lr schedule writes one param group's lr and leaves the others at "
               "their initial lr")
    fix = "apply the schedule to every param group (`for group, base in zip(optimizer.param_groups, base_lrs): group[\"lr\"] = base * factor`)"

    def check(self, a):
        for opt, groups in a.lr_timeline.items():
            if len(groups) < 2:
                continue
            moved, still = {}, []
            for index, points in groups.items():
                lrs = [p.lr for p in points if p.lr is not None]
                if len(lrs) < 3:
                    break
                changes = [p for before, p in zip(points, points[1:])
                           if p.lr is not None and before.lr is not None and p.lr != before.lr]
                if any(p.writer.scheduled for p in points):
                    break  # a torch scheduler owns this optimizer's lrs
                if len(changes) >= _MOVES and all(p.writer.by_hand for p in changes):
                    moved[index] = changes
                elif not changes and lrs[0] != 0:
                    still.append(index)
            else:
                if not moved or not still:
                    continue
                index, changes = next(iter(moved.items()))
                loc = next((p.writer.loc for p in changes if p.writer.loc is not None), None)
                if loc is None:
                    continue
                text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
                match = _ONE_GROUP.search(text)
                if match is None:
                    continue  # the write does not name one group: a loop, a helper
                lrs = [p.lr for p in groups[index]]
                frozen = ", ".join(f"group {g} (at lr {groups[g][0].lr:g})" for g in still[:3])
                frozen += f" of {a.optimizer_name(opt)}"
                yield self.finding(
                    f"`{text}` schedules the lr of param group {match.group(1)} only: it moved "
                    f"from {lrs[0]:.3g} to {lrs[-1]:.3g} over the steps graddoctor ran, while "
                    f"{frozen} never moved. The other groups get no warm-up and no decay; they "
                    f"train at their initial lr for the whole run",
                    loc, evidence={"optimizer": opt, "scheduled_group": index, "still_groups": still,
                                   "first_lr": lrs[0], "last_lr": lrs[-1]},
                    fix=self.fix)
