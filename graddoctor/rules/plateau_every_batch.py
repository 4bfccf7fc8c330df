from __future__ import annotations

from ..findings import Safety, Severity
from .base import Rule, plural, related
from .source import move_after

MIN_CALLS = 3  # plateau steps within one epoch before "every batch" is claimed


def is_plateau(cls: str | None) -> bool:
    return "ReduceLROnPlateau" in (cls or "")


def after_validation(a) -> set[int]:
    """Seqs of the plateau steps that follow a validation pass: since the previous optimizer
    step (or backward) the script switched a model to eval mode, iterated another DataLoader
    than the one it trains on, ran a forward without gradients or in eval mode, or stepped the
    scheduler under ``no_grad``. Their metric is per validation, however often that comes
    (a validation interval computed from the dataset size may be every batch). A metric that
    is a tensor requiring grad is a training loss whatever came before."""
    from ..analysis.lr import training_loader

    train_loader = training_loader(a)[0]
    found: set[int] = set()
    evidence = False
    for e in a.events:
        kind = e.kind
        if kind in ("step", "backward"):
            evidence = False
        elif kind == "eval" or (kind == "epoch_start" and e.get("loader") != train_loader) or (
                kind == "mode_forward" and not e.get("recalibrating")
                and (not e.get("grad") or e.get("inference") or not e.get("training"))):
            evidence = True
        elif kind == "scheduler_step" and is_plateau(e.get("cls")):
            if e.get("metric") != "grad_tensor" and (evidence or e.get("grad") is False):
                found.add(e.seq)
    return found


def _plateau_or_step(validated: set[int]):
    def key(e) -> tuple | None:
        if e.kind == "step":
            return "step", e["opt"]
        if e.kind == "scheduler_step" and is_plateau(e.get("cls")) and e.seq not in validated:
            return "sched", e["sched"]
        return None

    return key


class PlateauEveryBatch(Rule):
    """
    ## What it does
    Finds `ReduceLROnPlateau.step(metric)` called after every training batch (at least once
    per optimizer step, three or more times within one DataLoader epoch) instead of once per
    epoch or per validation.

    A step that follows a validation pass (since the last optimizer step: a model put in eval
    mode, another DataLoader iterated, a forward without gradients) is per validation, however
    often the script validates: a validation interval computed from the dataset's size comes out
    as every batch on a small dataset (Pytorch-UNet), and that is correct.

    Without a DataLoader graddoctor cannot see epochs: a scheduler stepped once per optimizer
    step is then reported as `info`, since full-batch training (one step per epoch) does exactly
    that correctly. Stepping once per epoch, after each validation (even several times per
    epoch), and schedulers meant to step per batch (`OneCycleLR`, a `LinearLR` warm-up) are
    left alone.

    ## Why is this bad?
    `patience` and `cooldown` count calls. Stepped per batch, `patience=10` means ten *batches*
    without improvement of a noisy per-batch loss, which happens all the time: the learning rate
    is cut again and again early in the first epoch, far before the model has plateaued, and
    training crawls on with a tiny learning rate. Nothing crashes.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=5)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step(loss.item())     # once per batch
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=5)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        scheduler.step(validate(model))     # once per epoch, on the validation metric
    ```

    ## Stays silent on
    `ReduceLROnPlateau` stepped once per epoch, after each validation (even several per
    epoch, or every batch when the validation interval comes out so), with full-batch
    training, or next to a per-batch warm-up; per-batch schedules such as `OneCycleLR`.
    """

    code = "GD210"
    slug = "plateau-every-batch"
    severity = Severity.WARNING
    summary = "ReduceLROnPlateau.step() is called every batch: patience counts batches, not epochs"
    fix = "call scheduler.step(val_metric) once per epoch (after validation), outside the batch loop"

    fix_safety = Safety.UNSAFE  # the metric it is given after the loop is the last batch's

    def autofix(self, finding, src):
        """Move ``scheduler.step(metric)`` out of the batch loop, once per epoch (unsafe: the
        metric is the last batch's value; a validation metric is better)."""
        sched = src.statement_at(finding.location.line)
        loop = src.enclosing_loop(sched) if sched is not None else None
        if loop is None or src.enclosing_loop(loop) is None:
            return None  # no epoch loop around the batch loop: nowhere once per epoch
        moved = move_after(src, sched, loop)
        return self.edit("step the plateau scheduler once per epoch, after the batch loop",
                         *moved) if moved else None

    def check(self, a):
        if not any(is_plateau(e.get("cls")) for e in a.of_kind("scheduler_step")):
            return
        # every plateau step and optimizer step, with how many times it happened in each
        # DataLoader epoch (folded copies included)
        groups = sorted(a.by_epoch(_plateau_or_step(after_validation(a))).items(),
                        key=lambda item: item[1][0][0].seq if item[1][0] else -1)
        found: dict = {}
        for ((what, sched), key), (events, n_calls) in groups:
            if what != "sched" or not events:
                continue
            opt = events[0].get("opt")
            mine = [(steps, n) for ((kind, o), k), (steps, n) in groups
                    if kind == "step" and k == key and (opt is None or o == opt)]
            n_steps = sum(n for _, n in mine)
            if n_calls < MIN_CALLS or n_calls < n_steps or n_steps < 1:
                continue
            if key is None and n_steps < MIN_CALLS:
                continue
            if sched not in found or (found[sched][1] is None and key is not None):
                found[sched] = (events, key, [s for steps, _ in mine for s in steps], n_calls, n_steps)
        for sched, (events, key, mine, n_calls, n_steps) in found.items():
            yield self._finding(a, events, key, mine, n_calls, n_steps)

    def _finding(self, a, events, key, mine, calls, steps):
        first = events[0]
        opt = first.get("opt")
        name = a.optimizer_name(opt) if opt is not None else "the optimizer"
        cls = first.get("cls") or "ReduceLROnPlateau"
        if key is not None:
            where = (f"after every batch ({plural(calls, 'call')} in epoch {key[1]} of "
                     f"the DataLoader, for {plural(steps, 'step')} of {name})")
            severity = None
            tail = ("its patience and cooldown count batches, not epochs, so a noisy per-batch "
                    "metric cuts the learning rate long before training has plateaued")
        else:
            where = (f"after every optimizer step ({plural(calls, 'call')} for "
                     f"{plural(steps, 'step')} of {name})")
            severity = Severity.INFO
            tail = ("if each step is a whole epoch (full-batch training) this is right; if the "
                    "loop runs over mini-batches, its patience counts batches, not epochs, and "
                    "the learning rate is cut far too early")
        message = f"{cls}.step() runs {where}: {tail}"
        return self.finding(
            message, first.loc, severity=severity, step=a.next_step_number(first.seq),
            related=(related(mine[0], "the optimizer step it follows each time"),),
            evidence={"scheduler": cls, "optimizer": opt, "calls": calls,
                      "steps": steps, "epoch": list(key) if key is not None else None},
        )
