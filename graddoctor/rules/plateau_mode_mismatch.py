from __future__ import annotations

import ast
import re

from ..findings import Severity
from .base import Rule, related
from .plateau_every_batch import is_plateau

# identifier words of a metric where higher is better, and where lower is better
HIGHER = frozenset({"acc", "accuracy", "score", "auc", "auroc", "f1", "r2", "map", "iou", "miou",
                    "dice", "bleu", "rouge", "precision", "recall", "psnr", "ssim", "reward",
                    "correct", "top1", "top5", "neg", "negative"})
LOWER = frozenset({"loss", "error", "err", "mse", "mae", "rmse", "ppl", "perplexity", "nll",
                   "wer", "cer", "distance", "dist"})


def _word_direction(text: str) -> str | None:
    words = set(re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", text).lower()))
    higher = bool(words & HIGHER) or any(w.startswith("acc") for w in words)
    lower = bool(words & LOWER)
    if higher == lower:
        return None
    return "max" if higher else "min"


def _signed_leaves(node: ast.AST, sign: int, out: list) -> None:
    """The operands of an arithmetic expression with the sign it gives each: a minus before it,
    the right side of a subtraction (``1 - acc``, an error rate) and a denominator flip it."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _signed_leaves(node.operand, -sign if isinstance(node.op, ast.USub) else sign, out)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        _signed_leaves(node.left, sign, out)
        flip = isinstance(node.op, (ast.Sub, ast.Div))
        _signed_leaves(node.right, -sign if flip else sign, out)
    elif not isinstance(node, ast.Constant):
        out.append((ast.unparse(node), sign))


def metric_direction(text: str | None) -> str | None:
    """"max" when the metric's source text names something higher-is-better (``val_acc``,
    ``-loss``), "min" when lower-is-better (``val_loss``, ``1 - accuracy``), None when it says
    neither or its operands disagree."""
    if not text:
        return None
    try:
        expr = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        expr = None
    if expr is None:
        direction = _word_direction(text)
        if direction is not None and text.lstrip().startswith("-"):
            direction = "min" if direction == "max" else "max"
        return direction
    leaves: list = []
    _signed_leaves(expr, 1, leaves)
    votes = set()
    for leaf, sign in leaves:
        direction = _word_direction(leaf)
        if direction is not None:
            votes.add(direction if sign > 0 else ("min" if direction == "max" else "max"))
    return votes.pop() if len(votes) == 1 else None


class PlateauModeMismatch(Rule):
    """
    ## What it does
    Finds a `ReduceLROnPlateau` whose `mode` disagrees with the metric it is fed: an accuracy,
    a score or a negated loss (higher is better) in `mode="min"` (the default), or a loss in
    `mode="max"`. Judged from what the metric did and when the learning rate fell: a cut while
    the metric kept improving in the direction its name says is a warning, and so is a step
    that fed it a new best in that direction (the scheduler counted it as an epoch without
    progress: the cut follows once its patience runs out); the name alone, with no improvement
    seen, is `info`.

    ## Why is this bad?
    The scheduler counts every improvement as a step without progress: with accuracy in
    `mode="min"` the lr is cut each time accuracy rises, patience after patience, so the better
    training goes the faster the lr decays to `min_lr`, and training stalls.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)
    ...
    scheduler.step(val_accuracy)
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=2)
    ...
    scheduler.step(val_accuracy)
    ```

    Where the constructor writes the mode out and the metric fed to `step` was bound beside
    one whose name says that mode's direction (`val_loss, val_f1 = evaluate()` then
    `scheduler.step(val_f1)` with `mode="min"`), the finding points at the step: the mode was
    chosen, the step was handed the wrong value.

    ## Stays silent on
    `mode="max"` fed accuracy, `mode="min"` fed a loss (also one that rises while the model
    overfits: its name says lower is better) or an error rate made from an accuracy
    (`1 - val_acc`: each name's sign read through the arithmetic around it), and a metric whose
    name says neither.
    """

    code = "GD225"
    slug = "plateau-mode-mismatch"
    severity = Severity.WARNING
    summary = ("ReduceLROnPlateau's mode disagrees with its metric: the lr falls while the "
               "metric improves")
    fix = "set mode to the metric's direction: mode=\"max\" for an accuracy or score, \"min\" for a loss"

    def check(self, a):
        by_sched: dict[int, list] = {}
        for e in a.of_kind("scheduler_step"):
            if is_plateau(e.get("cls")) and e.get("mode") in ("min", "max"):
                by_sched.setdefault(e.get("sched"), []).append(e)
        for sched, steps in by_sched.items():
            s = a.schedulers.get(sched)
            mode = steps[0]["mode"]
            first = steps[0]
            text = _metric_text(a, s, first)
            direction = metric_direction(text)
            if direction is None or direction == mode:
                continue
            cut = _cut_while_improving(s, steps, direction)
            values = [e.get("value") for e in steps if e.get("value") is not None]
            shown = text or "the metric"
            better = "rises" if direction == "max" else "falls"
            init = s.init if s is not None else None
            where = init if init is not None and init.loc is not None else first
            counted = _improvement_counted_as_none(steps, direction) if cut is None else None
            if cut is None and counted is not None:
                before, at = counted
                message = (f"this ReduceLROnPlateau runs in mode=\"{mode}\" but is fed {shown}, "
                           f"which improves as it {better}: when {shown} went from {before:.4g} "
                           f"to {at:.4g}, a new best, the scheduler counted it as an epoch without "
                           f"progress; once its patience runs out it cuts the lr, and every "
                           f"further improvement cuts it again")
                severity = None
            elif cut is not None:
                before, at, old_lr, new_lr = cut
                message = (f"this ReduceLROnPlateau runs in mode=\"{mode}\" but is fed {shown}, "
                           f"which improves as it {better}: after {shown} went from {before:.4g} "
                           f"to {at:.4g} it cut the lr from {old_lr:.3g} to {new_lr:.3g}; every "
                           f"further improvement counts as no progress and cuts it again")
                severity = None
            else:
                message = (f"this ReduceLROnPlateau runs in mode=\"{mode}\" but is fed {shown}, "
                           f"whose name says it improves as it {better}: it will count each "
                           f"improvement as no progress and cut the lr while training goes well "
                           f"(the replay saw {len(values)} value{'s' if len(values) != 1 else ''} "
                           f"and no cut yet)")
                severity = Severity.INFO
            fix = f"ReduceLROnPlateau(..., mode=\"{direction}\")"
            relations = (related(first, f"the step fed {shown}"),)
            meant = _metric_meant(a, init, first, text, mode)
            if meant is not None:  # the mode was chosen; the step was handed the wrong value
                message += (f" — the mode is written out and `{meant}`, a metric of that "
                            f"direction, is bound beside {shown}: the step was meant to get it")
                owner = a.source.called_object(first.loc.path, first.loc.line, "step") or "scheduler"
                fix = f"feed the metric the mode was written for: {owner}.step({meant})"
                where, relations = first, (related(init, f"mode=\"{mode}\" written here"),)
            yield self.finding(
                message, where.loc, severity=severity,
                related=relations,
                fix=fix,
                evidence={"mode": mode, "metric": shown, "direction": direction,
                          "values": values[:8], "cut": cut is not None})


def _metric_text(a, s, first) -> str | None:
    """The source text of the metric this scheduler's step was fed. A line that steps several
    schedulers (``s_a.step(val_f1); s_b.step(val_loss)``) is read at the call on the name the
    scheduler was assigned to; when that name is not among them, the line is not judged."""
    if first.loc is None:
        return None
    path, line = first.loc.path, first.loc.line
    receivers = set(a.source.method_receivers(path, line, "step"))
    if len(receivers) <= 1:
        return a.source.call_argument(path, line, "step", 0, "metrics")
    init = s.init if s is not None else None
    name = (a.source.assigned_name(init.loc.path, init.loc.line)
            if init is not None and init.loc is not None else None)
    if name not in receivers:
        return None
    return a.source.call_argument(path, line, "step", 0, "metrics", receiver=name)


def _improvement_counted_as_none(steps, direction):
    """(the previous best, the value fed) of the first step whose metric reached a new best in
    ``direction`` (the metric's name's) by a clear margin: with the mode the other way round,
    the scheduler counted that step as one without progress. None when no step improved."""
    best = None
    for e in steps:
        value = e.get("value")
        if not isinstance(value, (int, float)):
            continue
        if best is not None:
            margin = 1e-3 * max(abs(best), 1e-12)
            if (value > best + margin) if direction == "max" else (value < best - margin):
                return best, value
            best = max(best, value) if direction == "max" else min(best, value)
        else:
            best = value
    return None


def _cut_while_improving(s, steps, direction):
    """(the previous best, the value fed, lr before, lr after) of the first step that cut the
    lr just as the metric reached a new best in ``direction``; None when none did."""
    lr = None
    if s is not None and s.init is not None:
        lrs = s.init.get("lrs") or []
        lr = lrs[0] if lrs else None
    best = None
    for e in steps:
        value, lrs = e.get("value"), e.get("lrs") or []
        new_lr = lrs[0] if lrs else None
        if value is not None and best is not None and lr is not None and new_lr is not None:
            improved = value > best if direction == "max" else value < best
            if improved and new_lr < lr * (1 - 1e-9):
                return best, value, lr, new_lr
        if value is not None:
            best = value if best is None else (max(best, value) if direction == "max" else min(best, value))
        if new_lr is not None:
            lr = new_lr
    return None


def _metric_meant(a, init, first, text, mode):
    """The name bound beside the metric fed to the step (``val_loss, val_f1 = ...``) whose
    name says the direction of the constructor's ``mode``, when ``mode`` is written out there:
    the step, not the mode, is what to change. None otherwise."""
    if init is None or init.loc is None or first.loc is None or not text or not text.isidentifier():
        return None
    if a.source.keyword_line(init.loc.path, init.loc.line, "mode") is None:
        return None
    fitting = [n for n in a.source.bound_beside(first.loc.path, first.loc.line, text)
               if metric_direction(n) == mode]
    return fitting[0] if len(fitting) == 1 else None
